//! Tests of the PowerInfer reader and of the test files it is checked against.

use super::test_files::Noise;
use super::*;
use crate::gguf::{GgufWriter, Value};
use crate::plan::FfnActivation;
use crate::quant::Kernels;
use crate::sparse::predictor::PredictorScratch;
use crate::synthetic::{synthetic_model, SyntheticSpec};

fn relu_spec() -> SyntheticSpec {
    SyntheticSpec {
        n_layer: 3,
        n_embd: 64,
        n_ff: 160,
        activation: FfnActivation::Relu,
        relu_active_share: Some(0.2),
        ..SyntheticSpec::default()
    }
}

fn open(bytes: &[u8]) -> GgufFile {
    GgufFile::from_bytes(bytes.to_vec()).unwrap()
}

fn read(
    model: &GgufFile,
    pred: Option<&GgufFile>,
) -> Result<Option<PowerInferSparse>, PowerInferError> {
    let s = relu_spec();
    read_powerinfer(
        model,
        pred,
        s.n_embd as usize,
        s.n_ff as usize,
        s.n_layer as usize,
    )
}

/// f32 `fc2 · ReLU(fc1 · x)`, and per logit `Σ_j |fc2_ij| · Σ_k |fc1_jk x_k|` (the scale
/// Q8_0's relative errors apply to).
fn reference(fc1: &[f32], fc2: &[f32], x: &[f32], rank: usize) -> (Vec<f32>, Vec<f32>) {
    let d = x.len();
    let h: Vec<f32> = (0..rank)
        .map(|j| {
            let row = &fc1[j * d..(j + 1) * d];
            row.iter().zip(x).map(|(w, x)| w * x).sum::<f32>().max(0.0)
        })
        .collect();
    let habs: Vec<f32> = (0..rank)
        .map(|j| {
            let row = &fc1[j * d..(j + 1) * d];
            row.iter().zip(x).map(|(w, x)| (w * x).abs()).sum::<f32>()
        })
        .collect();
    let n_ff = fc2.len() / rank;
    let logits = (0..n_ff)
        .map(|i| {
            let row = &fc2[i * rank..(i + 1) * rank];
            row.iter().zip(&h).map(|(w, h)| w * h).sum()
        })
        .collect();
    let scale = (0..n_ff)
        .map(|i| {
            let row = &fc2[i * rank..(i + 1) * rank];
            row.iter().zip(&habs).map(|(w, h)| w.abs() * h).sum()
        })
        .collect();
    (logits, scale)
}

fn inputs(n: usize, d: usize) -> Vec<Vec<f32>> {
    let mut noise = Noise::new(12345);
    (0..n)
        .map(|_| (0..d).map(|_| noise.normal(1.0)).collect())
        .collect()
}

/// The predictors' logits match an f32 evaluation of the stored weights within Q8_0 error.
fn check_logits(sparse: &PowerInferSparse, files: &PowerInferTestFiles, rank: usize) {
    let kernels = Kernels::best();
    let n_embd = relu_spec().n_embd as usize;
    let (mut worst, mut worst_rms, mut sum, mut n) = (0f32, 0f32, 0f32, 0usize);
    for (l, layer) in sparse.layers.iter().enumerate() {
        let p = layer.predictor.as_ref().expect("predictor");
        assert_eq!(p.rank(), rank.div_ceil(32) * 32);
        let mut scratch = PredictorScratch::new(p);
        for x in inputs(8, n_embd) {
            let (want, scale) = reference(&files.fc1[l], &files.fc2[l], &x, rank);
            let got = p.logits(&kernels, &x, &mut scratch);
            let rms = (want.iter().map(|w| w * w).sum::<f32>() / want.len() as f32).sqrt();
            for ((g, w), s) in got.iter().zip(&want).zip(&scale) {
                let rel = (g - w).abs() / s.max(1e-6);
                worst = worst.max(rel);
                worst_rms = worst_rms.max((g - w).abs() / rms);
                sum += rel;
                n += 1;
            }
        }
    }
    assert!(worst < 0.01, "worst error {worst} of the abs-sum scale");
    assert!(sum / (n as f32) < 0.002, "mean error {}", sum / n as f32);
    assert!(
        worst_rms < 0.1,
        "worst error {worst_rms} of the logits' rms"
    );
}

#[test]
fn powerinfer_files_load_as_model_and_predictors() {
    let spec = PowerInferTestSpec::default();
    let files = powerinfer_test_files(&relu_spec(), &spec).unwrap();
    let model_file = open(&files.model);
    assert!(model_file.is_powerinfer());
    assert_eq!(&files.model[..4], b"PWRI");
    assert_eq!(&files.predictor[..4], b"PWRI");
    // ne order as PowerInfer writes it.
    assert_eq!(
        model_file.tensor("blk.0.fc1.weight").unwrap().dims,
        [64, 48]
    );
    assert_eq!(
        model_file.tensor("blk.0.fc2.weight").unwrap().dims,
        [48, 160]
    );
    assert_eq!(
        model_file.tensor("blk.2.ffn_down_t.weight").unwrap().dims,
        [64, 160]
    );

    let sparse = read(&model_file, None).unwrap().expect("pieces");
    assert_eq!(sparse.threshold, Some(0.25));
    assert_eq!(sparse.layers.len(), 3);
    assert!(sparse.has_predictors());
    for (l, layer) in sparse.layers.iter().enumerate() {
        assert_eq!(layer.predictor.as_ref().unwrap().threshold(), 0.25);
        assert_eq!(layer.down_t.as_ref(), Some(&files.down_t[l]));
        // Exactly the predictor `from_weights` makes of the stored values.
        let want = Predictor::from_weights(
            64,
            160,
            48,
            &files.fc1[l],
            vec![0.0; 48],
            &files.fc2[l],
            vec![0.0; 160],
            0.25,
        )
        .unwrap();
        assert_eq!(layer.predictor.as_ref(), Some(&want));
    }
    assert_eq!(sparse.down_type(), Some(GgmlType::Q4_1));
    check_logits(&sparse, &files, 48);
    // That the same file loads as an ordinary ReLU model: `model/config.rs`'s tests.
}

#[test]
fn powerinfer_predictor_file_supplies_predictors() {
    let spec = PowerInferTestSpec {
        rank: 64,
        fc_type: GgmlType::F32,
        threshold: None,
        predictors_in_model: false,
        seed: 3,
    };
    let files = powerinfer_test_files(&relu_spec(), &spec).unwrap();
    let (model_file, pred_file) = (open(&files.model), open(&files.predictor));
    assert!(pred_file.is_powerinfer());
    // The model file alone: down_t, no predictors.
    let alone = read(&model_file, None).unwrap().unwrap();
    assert!(!alone.has_predictors());
    assert!(alone.layers.iter().all(|l| l.down_t.is_some()));
    // With the predictor file.
    let sparse = read(&model_file, Some(&pred_file)).unwrap().unwrap();
    assert_eq!(sparse.threshold, None);
    assert_eq!(
        sparse.layers[0].predictor.as_ref().unwrap().threshold(),
        0.0
    );
    check_logits(&sparse, &files, 64);
    // The predictor file alone, next to a plain model: predictors, no down_t.
    let plain = open(&synthetic_model(&relu_spec()).unwrap().to_bytes().unwrap());
    let only = read(&plain, Some(&pred_file)).unwrap().unwrap();
    assert!(only.has_predictors());
    assert!(only.layers.iter().all(|l| l.down_t.is_none()));
    assert_eq!(only.down_type(), None);
}

#[test]
fn powerinfer_absent_gives_none() {
    let plain = open(&synthetic_model(&relu_spec()).unwrap().to_bytes().unwrap());
    assert!(read(&plain, None).unwrap().is_none());
    let empty = open(&GgufWriter::new().to_bytes().unwrap());
    assert!(read(&plain, Some(&empty)).unwrap().is_none());
    // Unrelated `blk.N.*` tensors (PowerInfer's GPU index, say) are not pieces.
    let mut w = GgufWriter::new();
    w.add_tensor("blk.0.gpu_idx", vec![160], GgmlType::I32, vec![0; 640])
        .unwrap();
    assert!(read(&plain, Some(&open(&w.to_bytes().unwrap())))
        .unwrap()
        .is_none());
}

#[test]
fn powerinfer_rank_padding_keeps_logits() {
    let (d, f, r) = (64, 96, 40);
    let mut noise = Noise::new(99);
    let fc1: Vec<f32> = (0..r * d).map(|_| noise.normal(0.2)).collect();
    let fc2: Vec<f32> = (0..f * r).map(|_| noise.normal(0.2)).collect();
    let b1: Vec<f32> = (0..r).map(|_| noise.normal(0.1)).collect();
    let b2: Vec<f32> = (0..f).map(|_| noise.normal(0.1)).collect();
    let p = Predictor::from_weights(d, f, r, &fc1, b1.clone(), &fc2, b2.clone(), 0.1).unwrap();
    assert_eq!(p.rank(), 64);
    // The same network padded by hand to rank 64.
    let mut fc1p = fc1.clone();
    fc1p.resize(64 * d, 0.0);
    let mut fc2p = vec![0f32; f * 64];
    for i in 0..f {
        fc2p[i * 64..i * 64 + r].copy_from_slice(&fc2[i * r..(i + 1) * r]);
    }
    let mut b1p = b1;
    b1p.resize(64, 0.0);
    let q = Predictor::from_weights(d, f, 64, &fc1p, b1p, &fc2p, b2, 0.1).unwrap();
    assert_eq!(p, q);
    let kernels = Kernels::best();
    let mut s = PredictorScratch::new(&p);
    for x in inputs(4, d) {
        let a = p.logits(&kernels, &x, &mut s).to_vec();
        let b = q.logits(&kernels, &x, &mut s).to_vec();
        assert_eq!(a, b);
        // And within Q8_0 error of the unpadded f32 network (biases zero here aside).
        assert!(a.iter().all(|v| v.is_finite()));
    }
    // Without biases, against the f32 reference of the unpadded weights.
    let p0 = Predictor::from_weights(d, f, r, &fc1, vec![0.0; r], &fc2, vec![0.0; f], 0.0).unwrap();
    let mut s0 = PredictorScratch::new(&p0);
    for x in inputs(4, d) {
        let (want, scale) = reference(&fc1, &fc2, &x, r);
        let got = p0.logits(&kernels, &x, &mut s0);
        for ((g, w), s) in got.iter().zip(&want).zip(&scale) {
            assert!((g - w).abs() <= 0.03 * s + 1e-6, "{g} vs {w} (scale {s})");
        }
    }
}

#[test]
fn powerinfer_from_weights_rejects_bad_input() {
    let ok = |r: usize| (vec![0.5f32; r * 64], vec![0.5f32; 32 * r]);
    let (fc1, fc2) = ok(8);
    let e = Predictor::from_weights(48, 32, 8, &fc1, vec![0.0; 8], &fc2, vec![0.0; 32], 0.0);
    assert!(matches!(e, Err(PredictorError::EmbdNotBlockMultiple(48))));
    let e = Predictor::from_weights(64, 32, 8, &fc1[1..], vec![0.0; 8], &fc2, vec![0.0; 32], 0.0);
    assert!(matches!(e, Err(PredictorError::Length { .. })));
    let e = Predictor::from_weights(64, 32, 0, &[], vec![], &[], vec![0.0; 32], 0.0);
    assert!(matches!(e, Err(PredictorError::Config(_))));
    let mut bad = fc1.clone();
    bad[3] = f32::NAN;
    let e = Predictor::from_weights(64, 32, 8, &bad, vec![0.0; 8], &fc2, vec![0.0; 32], 0.0);
    assert!(matches!(e, Err(PredictorError::Malformed(_))));
    let e = Predictor::from_weights(64, 32, 8, &fc1, vec![0.0; 8], &fc2, vec![0.0; 32], f32::NAN);
    assert!(matches!(e, Err(PredictorError::Malformed(_))));
}

/// A file whose metadata `meta` writes, then the tensors `tensor(l, ..)` writes for each of
/// `layers` layers.
fn file_with(
    layers: usize,
    mut tensor: impl FnMut(usize, &mut GgufWriter),
    meta: impl FnOnce(&mut GgufWriter),
) -> GgufFile {
    let mut w = GgufWriter::new();
    meta(&mut w);
    for l in 0..layers {
        tensor(l, &mut w);
    }
    open(&w.to_bytes().unwrap())
}

fn f16_tensor(w: &mut GgufWriter, name: String, dims: [u64; 2]) {
    let n = (dims[0] * dims[1]) as usize;
    w.add_tensor(name, dims.to_vec(), GgmlType::F16, vec![0; 2 * n])
        .unwrap();
}

fn good_layer(l: usize, w: &mut GgufWriter) {
    f16_tensor(w, fc1_name(l), [64, 32]);
    f16_tensor(w, fc2_name(l), [32, 160]);
}

#[test]
fn powerinfer_errors_name_the_tensor() {
    let plain = open(&GgufWriter::new().to_bytes().unwrap());
    let err = |f: &GgufFile| read(&plain, Some(f)).unwrap_err();
    let msg = |e: &PowerInferError| e.to_string();

    // A good file reads.
    let good = file_with(3, good_layer, |_| {});
    assert_eq!(read(&plain, Some(&good)).unwrap().unwrap().layers.len(), 3);

    // fc1 transposed (torch order instead of ggml order).
    let f = file_with(
        3,
        |l, w| {
            f16_tensor(w, fc1_name(l), [32, 64]);
            f16_tensor(w, fc2_name(l), [32, 160]);
        },
        |_| {},
    );
    let e = err(&f);
    assert!(
        matches!(&e, PowerInferError::Shape { tensor, .. } if tensor == "blk.0.fc1.weight"),
        "{e}"
    );
    assert!(msg(&e).contains("[64, rank]"), "{e}");

    // fc2 with another rank than fc1.
    let f = file_with(
        3,
        |l, w| {
            f16_tensor(w, fc1_name(l), [64, 32]);
            f16_tensor(w, fc2_name(l), [64, 160]);
        },
        |_| {},
    );
    let e = err(&f);
    assert!(
        matches!(&e, PowerInferError::Shape { tensor, .. } if tensor == "blk.0.fc2.weight"),
        "{e}"
    );
    assert!(msg(&e).contains("[32, 160]"), "{e}");

    // A layer without predictor.
    let f = file_with(
        3,
        |l, w| {
            if l != 1 {
                good_layer(l, w)
            }
        },
        |_| {},
    );
    let e = err(&f);
    assert!(
        matches!(&e, PowerInferError::Missing { tensor, .. } if tensor == "blk.1.fc1.weight"),
        "{e}"
    );

    // A layer past the model's.
    let f = file_with(4, good_layer, |_| {});
    let e = err(&f);
    assert!(
        matches!(&e, PowerInferError::ExtraLayer { layer: 3, .. }),
        "{e}"
    );

    // A type the runtime cannot dequantize.
    let f = file_with(
        3,
        |l, w| {
            w.add_tensor(
                fc1_name(l),
                vec![64, 32],
                GgmlType::MXFP4,
                vec![0; 2 * 32 * 17],
            )
            .unwrap();
            f16_tensor(w, fc2_name(l), [32, 160]);
        },
        |_| {},
    );
    let e = err(&f);
    assert!(
        matches!(&e, PowerInferError::UnsupportedType { tensor, ty: GgmlType::MXFP4, .. }
            if tensor == "blk.0.fc1.weight"),
        "{e}"
    );

    // A bias (not part of the format).
    let f = file_with(
        3,
        |l, w| {
            good_layer(l, w);
            if l == 2 {
                w.add_tensor("blk.2.fc1.bias", vec![32], GgmlType::F32, vec![0; 128])
                    .unwrap();
            }
        },
        |_| {},
    );
    assert!(matches!(err(&f), PowerInferError::Unexpected { .. }));

    // down_t of the wrong shape, and of a type the kernels do not read.
    let f = file_with(3, |l, w| f16_tensor(w, down_t_name(l), [160, 64]), |_| {});
    let e = err(&f);
    assert!(
        matches!(&e, PowerInferError::Shape { tensor, .. } if tensor == "blk.0.ffn_down_t.weight"),
        "{e}"
    );
    let f = file_with(
        3,
        |l, w| {
            w.add_tensor(
                down_t_name(l),
                vec![64, 160],
                GgmlType::MXFP4,
                vec![0; 160 * 2 * 17],
            )
            .unwrap();
        },
        |_| {},
    );
    assert!(matches!(err(&f), PowerInferError::UnsupportedType { .. }));

    // Bad thresholds.
    let f = file_with(3, good_layer, |w| {
        w.add_metadata(SPARSE_THRESHOLD_KEY, Value::String("0.5".into()))
            .unwrap();
    });
    assert!(matches!(err(&f), PowerInferError::Gguf(_)));
    let f = file_with(3, good_layer, |w| {
        w.add_metadata(SPARSE_THRESHOLD_KEY, Value::F32(f32::INFINITY))
            .unwrap();
    });
    assert!(matches!(err(&f), PowerInferError::Metadata { .. }));

    // n_embd the predictors cannot serve.
    let e = read_powerinfer(&plain, Some(&good), 48, 160, 3).unwrap_err();
    assert!(matches!(e, PowerInferError::Shape { .. }), "{e}");
    let f = file_with(
        3,
        |l, w| {
            f16_tensor(w, fc1_name(l), [48, 32]);
            f16_tensor(w, fc2_name(l), [32, 160]);
        },
        |_| {},
    );
    let e = read_powerinfer(&plain, Some(&f), 48, 160, 3).unwrap_err();
    assert!(
        matches!(
            e,
            PowerInferError::Predictor {
                layer: 0,
                source: PredictorError::EmbdNotBlockMultiple(48)
            }
        ),
        "{e}"
    );
}

#[test]
fn powerinfer_test_files_write_to_disk() {
    let dir = std::env::temp_dir().join(format!("conductor-pwri-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (m, p) = (dir.join("model.powerinfer.gguf"), dir.join("pred.gguf"));
    let files =
        write_powerinfer_test_files(&relu_spec(), &PowerInferTestSpec::default(), &m, &p).unwrap();
    let model = GgufFile::open(&m).unwrap();
    let pred = GgufFile::open(&p).unwrap();
    assert!(model.is_powerinfer() && pred.is_powerinfer());
    let sparse = read(&model, Some(&pred)).unwrap().unwrap();
    check_logits(&sparse, &files, 48);
    std::fs::remove_dir_all(&dir).unwrap();
}
