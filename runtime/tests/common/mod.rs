//! Helpers shared by the runtime's integration tests.

use conductor_runtime::model::Model;
use conductor_runtime::quant::dequantize_row;

/// The rows of a tensor as stored in the file (`dims[0]` values each), dequantized: read from
/// the GGUF by name, independently of how the model lays its experts out.
pub fn raw_rows(model: &Model, name: &str) -> Vec<Vec<f32>> {
    let file = model.file();
    let t = file.tensor(name).unwrap_or_else(|| panic!("{name}"));
    let cols = t.dims[0] as usize;
    let row_bytes = t.ty.bytes_for(cols as u64).unwrap() as usize;
    file.tensor_data(t)
        .chunks_exact(row_bytes)
        .map(|r| {
            let mut row = vec![0f32; cols];
            dequantize_row(t.ty, r, &mut row).unwrap();
            row
        })
        .collect()
}
