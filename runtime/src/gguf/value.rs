//! Metadata values: the thirteen GGUF value types, with arrays kept as typed vectors so that a
//! 49k-entry vocabulary is one `Vec<String>`, not 49k boxed enums.

/// Type ids of metadata values, as stored in the file.
pub(crate) mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// Deepest array-of-array nesting accepted (an array of scalars has depth 1). The format sets no
/// limit; this one keeps the reader's recursion bounded on hostile input.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A metadata array: all elements have one type, so each variant is a plain vector.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    /// Nested arrays; the inner arrays may have different element types and lengths.
    Array(Vec<Array>),
}

impl Value {
    /// The file's type id for this value.
    pub fn type_id(&self) -> u32 {
        use type_id::*;
        match self {
            Value::U8(_) => U8,
            Value::I8(_) => I8,
            Value::U16(_) => U16,
            Value::I16(_) => I16,
            Value::U32(_) => U32,
            Value::I32(_) => I32,
            Value::U64(_) => U64,
            Value::I64(_) => I64,
            Value::F32(_) => F32,
            Value::F64(_) => F64,
            Value::Bool(_) => BOOL,
            Value::String(_) => STRING,
            Value::Array(_) => ARRAY,
        }
    }

    /// A short name for error messages, e.g. `u32` or `array of string`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Array(a) => a.type_name(),
            v => scalar_type_name(v.type_id()),
        }
    }

    /// The value as a `u64` when it is an integer of any width holding a non-negative value.
    pub fn to_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Whether this is an integer type (of any width and sign).
    pub fn is_integer(&self) -> bool {
        matches!(
            self,
            Value::U8(_)
                | Value::I8(_)
                | Value::U16(_)
                | Value::I16(_)
                | Value::U32(_)
                | Value::I32(_)
                | Value::U64(_)
                | Value::I64(_)
        )
    }

    /// The string, when this is a string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The array, when this is an array value.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Array nesting depth: 0 for scalars, 1 for an array of scalars, and so on.
    pub fn depth(&self) -> usize {
        match self {
            Value::Array(a) => a.depth(),
            _ => 0,
        }
    }
}

/// Name of a scalar (non-array) type id.
pub(crate) fn scalar_type_name(id: u32) -> &'static str {
    use type_id::*;
    match id {
        U8 => "u8",
        I8 => "i8",
        U16 => "u16",
        I16 => "i16",
        U32 => "u32",
        I32 => "i32",
        F32 => "f32",
        BOOL => "bool",
        STRING => "string",
        ARRAY => "array",
        U64 => "u64",
        I64 => "i64",
        F64 => "f64",
        _ => "unknown",
    }
}

macro_rules! array_accessors {
    ($($(#[$doc:meta])* $fn:ident => $variant:ident : $t:ty,)*) => {
        $(
            $(#[$doc])*
            pub fn $fn(&self) -> Option<&[$t]> {
                match self {
                    Array::$variant(v) => Some(v),
                    _ => None,
                }
            }
        )*
    };
}

impl Array {
    /// Removes every element and frees their memory; the element type stays.
    pub fn clear(&mut self) {
        match self {
            Array::U8(v) => *v = Vec::new(),
            Array::I8(v) => *v = Vec::new(),
            Array::U16(v) => *v = Vec::new(),
            Array::I16(v) => *v = Vec::new(),
            Array::U32(v) => *v = Vec::new(),
            Array::I32(v) => *v = Vec::new(),
            Array::U64(v) => *v = Vec::new(),
            Array::I64(v) => *v = Vec::new(),
            Array::F32(v) => *v = Vec::new(),
            Array::F64(v) => *v = Vec::new(),
            Array::Bool(v) => *v = Vec::new(),
            Array::String(v) => *v = Vec::new(),
            Array::Array(v) => *v = Vec::new(),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file's type id of the elements.
    pub fn element_type_id(&self) -> u32 {
        use type_id::*;
        match self {
            Array::U8(_) => U8,
            Array::I8(_) => I8,
            Array::U16(_) => U16,
            Array::I16(_) => I16,
            Array::U32(_) => U32,
            Array::I32(_) => I32,
            Array::U64(_) => U64,
            Array::I64(_) => I64,
            Array::F32(_) => F32,
            Array::F64(_) => F64,
            Array::Bool(_) => BOOL,
            Array::String(_) => STRING,
            Array::Array(_) => ARRAY,
        }
    }

    /// A short name for error messages, e.g. `array of string`.
    pub fn type_name(&self) -> &'static str {
        use type_id::*;
        match self.element_type_id() {
            U8 => "array of u8",
            I8 => "array of i8",
            U16 => "array of u16",
            I16 => "array of i16",
            U32 => "array of u32",
            I32 => "array of i32",
            F32 => "array of f32",
            BOOL => "array of bool",
            STRING => "array of string",
            U64 => "array of u64",
            I64 => "array of i64",
            F64 => "array of f64",
            _ => "array of array",
        }
    }

    /// Nesting depth: 1 for an array of scalars, 2 for an array of arrays of scalars, ...
    pub fn depth(&self) -> usize {
        match self {
            Array::Array(v) => 1 + v.iter().map(Array::depth).max().unwrap_or(0),
            _ => 1,
        }
    }

    array_accessors! {
        /// The elements, when they are `u8`.
        as_u8 => U8: u8,
        /// The elements, when they are `i8`.
        as_i8 => I8: i8,
        /// The elements, when they are `u16`.
        as_u16 => U16: u16,
        /// The elements, when they are `i16`.
        as_i16 => I16: i16,
        /// The elements, when they are `u32`.
        as_u32 => U32: u32,
        /// The elements, when they are `i32` (e.g. `tokenizer.ggml.token_type`).
        as_i32 => I32: i32,
        /// The elements, when they are `u64`.
        as_u64 => U64: u64,
        /// The elements, when they are `i64`.
        as_i64 => I64: i64,
        /// The elements, when they are `f32` (e.g. `tokenizer.ggml.scores`).
        as_f32 => F32: f32,
        /// The elements, when they are `f64`.
        as_f64 => F64: f64,
        /// The elements, when they are `bool`.
        as_bool => Bool: bool,
        /// The elements, when they are strings (e.g. `tokenizer.ggml.tokens`).
        as_strings => String: String,
        /// The inner arrays, when this is an array of arrays.
        as_arrays => Array: Array,
    }
}

macro_rules! from_impls {
    ($($t:ty => $variant:ident,)*) => {
        $(
            impl From<$t> for Value {
                fn from(v: $t) -> Value {
                    Value::$variant(v)
                }
            }
            impl From<Vec<$t>> for Array {
                fn from(v: Vec<$t>) -> Array {
                    Array::$variant(v)
                }
            }
            impl From<Vec<$t>> for Value {
                fn from(v: Vec<$t>) -> Value {
                    Value::Array(Array::$variant(v))
                }
            }
        )*
    };
}

from_impls! {
    u8 => U8,
    i8 => I8,
    u16 => U16,
    i16 => I16,
    u32 => U32,
    i32 => I32,
    u64 => U64,
    i64 => I64,
    f32 => F32,
    f64 => F64,
    bool => Bool,
    String => String,
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::String(v.to_owned())
    }
}

impl From<Array> for Value {
    fn from(v: Array) -> Value {
        Value::Array(v)
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Value {
        Value::Array(Array::String(v.into_iter().map(str::to_owned).collect()))
    }
}
