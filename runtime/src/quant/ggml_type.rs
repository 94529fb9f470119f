//! The ggml tensor type ids as stored in GGUF files, with their block geometry.
//!
//! Every type ggml knows is listed, so that a file holding tensors of a type Conductor cannot
//! compute with still parses (and its sizes are still checked); `GgmlType::is_supported` says
//! which ones the kernels handle.

use std::fmt;

/// A ggml tensor element type (the `ggml_type` enum of ggml.h; ids are part of the file format).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
    Q2_0,
}

/// (type, file id, name, elements per block, bytes per block). Sizes from ggml-common.h.
const TABLE: &[(GgmlType, u32, &str, usize, usize)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36),
    (GgmlType::Q2_K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3_K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4_K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5_K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6_K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8_K, 15, "Q8_K", 256, 292),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", 256, 66),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", 256, 74),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", 256, 98),
    (GgmlType::IQ1_S, 19, "IQ1_S", 256, 50),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ3_S, 21, "IQ3_S", 256, 110),
    (GgmlType::IQ2_S, 22, "IQ2_S", 256, 82),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1_M, 29, "IQ1_M", 256, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
    (GgmlType::NVFP4, 40, "NVFP4", 64, 36),
    (GgmlType::Q1_0, 41, "Q1_0", 128, 18),
    (GgmlType::Q2_0, 42, "Q2_0", 64, 18),
];

impl GgmlType {
    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        // TABLE lists the variants in declaration order (checked by a test), so the discriminant
        // indexes it: this sits on the kernels' per-call path, where a scan showed up.
        &TABLE[self as usize]
    }

    /// The type for a file's type id, or `None` for an id ggml does not define.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }

    /// The id stored in GGUF files.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// The name llama.cpp prints for this type (e.g. `Q4_K`).
    /// The type whose name is `name` (as ggml spells it, any case: `Q4_1`, `q4_1`).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE
            .iter()
            .find(|row| row.2.eq_ignore_ascii_case(name))
            .map(|row| row.0)
    }

    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.row().4
    }

    /// Bytes taken by `n_elements` elements, or `None` when `n_elements` is not a whole number of
    /// blocks or the size overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(self.type_size() as u64)
    }

    /// Whether Conductor's kernels can compute with tensors of this type.
    pub fn is_supported(self) -> bool {
        matches!(
            self,
            GgmlType::F32
                | GgmlType::F16
                | GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q8_0
                | GgmlType::Q4_K
                | GgmlType::Q6_K
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::IQ4_NL
                | GgmlType::Q2_K
                | GgmlType::Q3_K
                | GgmlType::Q5_K
                | GgmlType::IQ4_XS
                | GgmlType::BF16
        )
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Serialized by name (`"Q4_1"`), so plans, profiles and traces stay readable.
impl serde::Serialize for GgmlType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for GgmlType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        GgmlType::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown ggml type `{name}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for (i, r) in TABLE.iter().enumerate() {
            assert_eq!(GgmlType::from_id(r.1), Some(r.0));
            assert_eq!(r.0.id(), r.1);
            for other in &TABLE[i + 1..] {
                assert_ne!(r.0, other.0);
                assert_ne!(r.1, other.1);
            }
        }
        assert_eq!(GgmlType::from_id(4), None, "Q4_2 was removed from ggml");
        assert_eq!(GgmlType::from_id(1000), None);
    }

    #[test]
    fn table_is_in_declaration_order() {
        for (i, r) in TABLE.iter().enumerate() {
            assert_eq!(r.0 as usize, i, "{}", r.2);
        }
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(GgmlType::Q4_1.bytes_for(576), Some(18 * 20));
        assert_eq!(GgmlType::Q4_1.bytes_for(33), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
        assert_eq!(GgmlType::Q6_K.bytes_for(512), Some(420));
    }
}
