//! Reads the golden files written by ggml itself and checks every `kv.*` value and every tensor
//! against tables taken from an independent parse (a few lines of Python `struct` code).
//! Also re-writes each file with `GgufWriter` and requires the very same bytes.

use std::path::PathBuf;

use tessera::DType;
use tessera_gguf::{dump, GgufFile, GgufWriter, Value, ValueType};

/// `$TESSERA_GOLDEN_DIR`, else `../shared/golden` from the project root; `None` (after saying so
/// on stderr) when it is absent.
fn golden_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os("TESSERA_GOLDEN_DIR") {
        Some(d) => PathBuf::from(d),
        // CARGO_MANIFEST_DIR is crates/tessera-gguf; the project root is two levels up.
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden"),
    };
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "SKIPPED: golden dir ../shared/golden not found (looked in {})",
            dir.display()
        );
        None
    }
}

fn open(name: &str) -> Option<GgufFile> {
    let path = golden_dir()?.join(name);
    Some(GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// The `kv.*` keys, which hold one value of every GGUF type.
fn check_kv_values(f: &GgufFile) {
    let get = |k: &str| f.get(k).unwrap_or_else(|| panic!("missing key {k}"));
    assert_eq!(get("kv.u8"), &Value::U8(200));
    assert_eq!(get("kv.i8"), &Value::I8(-100));
    assert_eq!(get("kv.u16"), &Value::U16(60000));
    assert_eq!(get("kv.i16"), &Value::I16(-30000));
    assert_eq!(get("kv.u32"), &Value::U32(4_000_000_000));
    assert_eq!(get("kv.i32"), &Value::I32(-2_000_000_000));
    assert_eq!(get("kv.f32"), &Value::F32(3.25));
    assert_eq!(get("kv.u64"), &Value::U64(18_000_000_000_000_000_000));
    assert_eq!(get("kv.i64"), &Value::I64(-9_000_000_000_000_000_000));
    assert_eq!(get("kv.f64"), &Value::F64(-2.5e300));
    assert_eq!(get("kv.bool"), &Value::Bool(true));
    assert_eq!(get("kv.str"), &Value::String("héllo, ggml ✓".into()));
    assert_eq!(
        get("kv.arr_i32"),
        &Value::Array(
            ValueType::I32,
            [1, -2, 3, -4, 5].into_iter().map(Value::I32).collect()
        )
    );
    assert_eq!(
        get("kv.arr_str"),
        &Value::Array(
            ValueType::String,
            ["a", "", "ünïcode"].into_iter().map(Value::from).collect()
        )
    );
    // Accessors on real data.
    assert_eq!(get("kv.u64").as_u64(), Some(18_000_000_000_000_000_000));
    assert_eq!(get("kv.i8").as_i64(), Some(-100));
    assert_eq!(get("kv.str").as_str(), Some("héllo, ggml ✓"));
    assert_eq!(get("kv.arr_str").as_array().map(|a| a.len()), Some(3));
}

fn check_file(
    f: &GgufFile,
    keys: &[&str],
    tensors: &[(&str, u32, &[usize], usize)],
    data_offset: usize,
    len: usize,
) {
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.bytes().len(), len);
    assert_eq!(f.data_offset, data_offset);
    assert!(f.is_mmapped());
    let got_keys: Vec<&str> = f.metadata.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(got_keys, keys);
    assert_eq!(f.tensors.len(), tensors.len());
    for (i, (t, &(name, type_id, shape, offset))) in f.tensors.iter().zip(tensors).enumerate() {
        assert_eq!(t.name, name, "tensor #{i}");
        assert_eq!(t.dtype.id(), type_id, "tensor {name}");
        assert_eq!(t.shape(), shape, "tensor {name}");
        assert_eq!(t.offset, offset, "tensor {name}");
        let mut ne = [1usize; 4];
        ne[..shape.len()].copy_from_slice(shape);
        assert_eq!(t.ne, ne, "tensor {name}");
        let rows: usize = ne[1..].iter().product();
        assert_eq!(
            Some(t.size),
            t.dtype.row_size(ne[0]).map(|r| r * rows),
            "tensor {name}"
        );
        assert_eq!(f.tensor(name), Some(t));
        assert_eq!(f.tensor_data(t).len(), t.size);
        // ggml lays tensors out back to back, each padded to the alignment.
        let next = tensors
            .get(i + 1)
            .map_or(len - data_offset, |&(_, _, _, o)| o);
        assert_eq!(
            next,
            (t.offset + t.size).next_multiple_of(32),
            "tensor {name}"
        );
    }
}

/// Re-writing the file from what was read gives the same bytes.
fn check_rewrite_identical(f: &GgufFile) {
    let w = GgufWriter::from_gguf(f).unwrap();
    let bytes = w.to_bytes().unwrap();
    assert_eq!(bytes.len(), f.bytes().len());
    assert!(bytes == f.bytes(), "re-written file differs");
}

#[test]
fn quant_gaussian() {
    let Some(f) = open("quant-gaussian.gguf") else {
        return;
    };
    check_kv_values(&f);
    assert_eq!(f.get("golden.nrows"), Some(&Value::I64(8)));
    assert_eq!(f.get("golden.n_per_row"), Some(&Value::I64(1024)));
    check_file(
        &f,
        GAUSSIAN_KEYS,
        GAUSSIAN_TENSORS,
        GAUSSIAN_DATA_OFFSET,
        GAUSSIAN_LEN,
    );
    // The first tensor is `input`, f32 [1024, 8]: spot-check that its data reads as finite floats.
    let input = f.tensor("input").unwrap();
    assert_eq!(input.dtype, DType::F32);
    let data = f.tensor_data(input);
    assert!(data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .all(f32::is_finite));
    check_rewrite_identical(&f);
}

#[test]
fn quant_adversarial() {
    let Some(f) = open("quant-adversarial.gguf") else {
        return;
    };
    check_kv_values(&f);
    assert_eq!(f.get("golden.nrows"), Some(&Value::I64(16)));
    assert_eq!(f.get("golden.n_per_row"), Some(&Value::I64(768)));
    check_file(
        &f,
        ADVERSARIAL_KEYS,
        ADVERSARIAL_TENSORS,
        ADVERSARIAL_DATA_OFFSET,
        ADVERSARIAL_LEN,
    );
    check_rewrite_identical(&f);
}

#[test]
fn ops_file_reads_and_rewrites() {
    let Some(f) = open("ops.gguf") else {
        return;
    };
    assert_eq!(f.metadata.len(), 113);
    assert_eq!(f.tensors.len(), 323);
    assert_eq!(f.data_offset, 21984);
    let t = f.tensor("c000/in0").unwrap();
    assert_eq!(
        (t.dtype, t.shape(), t.offset),
        (DType::F32, &[16, 5, 3, 2][..], 0)
    );
    let t = f.tensor("c111/out").unwrap();
    assert_eq!(
        (t.dtype, t.shape(), t.offset),
        (DType::F32, &[16, 5][..], 725152)
    );
    assert_eq!(
        f.get("c000.desc").and_then(Value::as_str),
        Some("op=add broadcast=src1")
    );
    check_rewrite_identical(&f);
}

#[test]
fn dump_of_golden_file() {
    let Some(f) = open("quant-gaussian.gguf") else {
        return;
    };
    let d = dump(&f);
    assert!(
        d.starts_with("GGUF v3: 20 key/value pairs, 79 tensors, alignment 32"),
        "{d}"
    );
    assert!(d.contains("kv.str"), "{d}");
    assert!(d.contains("\"héllo, ggml ✓\""), "{d}");
    assert!(d.contains("[i32; 5]  = [1, -2, 3, -4, 5]") || d.contains("= [1, -2, 3, -4, 5]"));
    assert!(d.contains("-2.5e300"), "{d}");
    assert!(d.contains("1024 x 8"), "{d}");
    assert!(d.contains("q4_0"), "{d}");
}

/// `quant-gaussian.gguf`: (name, ggml type id, shape, offset), from an independent Python parse.
const GAUSSIAN_TENSORS: &[(&str, u32, &[usize], usize)] = &[
    ("input", 0, &[1024, 8], 0),
    ("imatrix", 0, &[1024], 32768),
    ("q.f16", 1, &[1024, 8], 36864),
    ("dq.f16", 0, &[1024, 8], 53248),
    ("q.q4_0", 2, &[1024, 8], 86016),
    ("dq.q4_0", 0, &[1024, 8], 90624),
    ("qi.q4_0", 2, &[1024, 8], 123392),
    ("q.q4_1", 3, &[1024, 8], 128000),
    ("dq.q4_1", 0, &[1024, 8], 133120),
    ("qi.q4_1", 3, &[1024, 8], 165888),
    ("q.q5_0", 6, &[1024, 8], 171008),
    ("dq.q5_0", 0, &[1024, 8], 176640),
    ("qi.q5_0", 6, &[1024, 8], 209408),
    ("q.q5_1", 7, &[1024, 8], 215040),
    ("dq.q5_1", 0, &[1024, 8], 221184),
    ("qi.q5_1", 7, &[1024, 8], 253952),
    ("q.q8_0", 8, &[1024, 8], 260096),
    ("dq.q8_0", 0, &[1024, 8], 268800),
    ("qi.q8_0", 8, &[1024, 8], 301568),
    ("q.q8_1", 9, &[1024, 8], 310272),
    ("q.q2_K", 10, &[1024, 8], 319488),
    ("dq.q2_K", 0, &[1024, 8], 322176),
    ("qi.q2_K", 10, &[1024, 8], 354944),
    ("q.q3_K", 11, &[1024, 8], 357632),
    ("dq.q3_K", 0, &[1024, 8], 361152),
    ("qi.q3_K", 11, &[1024, 8], 393920),
    ("q.q4_K", 12, &[1024, 8], 397440),
    ("dq.q4_K", 0, &[1024, 8], 402048),
    ("qi.q4_K", 12, &[1024, 8], 434816),
    ("q.q5_K", 13, &[1024, 8], 439424),
    ("dq.q5_K", 0, &[1024, 8], 445056),
    ("qi.q5_K", 13, &[1024, 8], 477824),
    ("q.q6_K", 14, &[1024, 8], 483456),
    ("dq.q6_K", 0, &[1024, 8], 490176),
    ("qi.q6_K", 14, &[1024, 8], 522944),
    ("q.iq2_xxs", 16, &[1024, 8], 529664),
    ("dq.iq2_xxs", 0, &[1024, 8], 531776),
    ("q.iq2_xs", 17, &[1024, 8], 564544),
    ("dq.iq2_xs", 0, &[1024, 8], 566912),
    ("q.iq3_xxs", 18, &[1024, 8], 599680),
    ("dq.iq3_xxs", 0, &[1024, 8], 602816),
    ("qi.iq3_xxs", 18, &[1024, 8], 635584),
    ("q.iq1_s", 19, &[1024, 8], 638720),
    ("dq.iq1_s", 0, &[1024, 8], 640320),
    ("q.iq4_nl", 20, &[1024, 8], 673088),
    ("dq.iq4_nl", 0, &[1024, 8], 677696),
    ("qi.iq4_nl", 20, &[1024, 8], 710464),
    ("q.iq3_s", 21, &[1024, 8], 715072),
    ("dq.iq3_s", 0, &[1024, 8], 718592),
    ("qi.iq3_s", 21, &[1024, 8], 751360),
    ("q.iq2_s", 22, &[1024, 8], 754880),
    ("dq.iq2_s", 0, &[1024, 8], 757504),
    ("qi.iq2_s", 22, &[1024, 8], 790272),
    ("q.iq4_xs", 23, &[1024, 8], 792896),
    ("dq.iq4_xs", 0, &[1024, 8], 797248),
    ("qi.iq4_xs", 23, &[1024, 8], 830016),
    ("q.iq1_m", 29, &[1024, 8], 834368),
    ("dq.iq1_m", 0, &[1024, 8], 836160),
    ("qi.iq1_m", 29, &[1024, 8], 868928),
    ("q.bf16", 30, &[1024, 8], 870720),
    ("dq.bf16", 0, &[1024, 8], 887104),
    ("q.tq1_0", 34, &[1024, 8], 919872),
    ("dq.tq1_0", 0, &[1024, 8], 921600),
    ("qi.tq1_0", 34, &[1024, 8], 954368),
    ("q.tq2_0", 35, &[1024, 8], 956096),
    ("dq.tq2_0", 0, &[1024, 8], 958208),
    ("qi.tq2_0", 35, &[1024, 8], 990976),
    ("q.mxfp4", 39, &[1024, 8], 993088),
    ("dq.mxfp4", 0, &[1024, 8], 997440),
    ("qi.mxfp4", 39, &[1024, 8], 1030208),
    ("q.nvfp4", 40, &[1024, 8], 1034560),
    ("dq.nvfp4", 0, &[1024, 8], 1039168),
    ("qi.nvfp4", 40, &[1024, 8], 1071936),
    ("q.q1_0", 41, &[1024, 8], 1076544),
    ("dq.q1_0", 0, &[1024, 8], 1077696),
    ("qi.q1_0", 41, &[1024, 8], 1110464),
    ("q.q2_0", 42, &[1024, 8], 1111616),
    ("dq.q2_0", 0, &[1024, 8], 1113920),
    ("qi.q2_0", 42, &[1024, 8], 1146688),
];
const GAUSSIAN_KEYS: &[&str] = &[
    "golden.generator",
    "golden.seed",
    "golden.mode",
    "golden.nrows",
    "golden.n_per_row",
    "kv.u8",
    "kv.i8",
    "kv.u16",
    "kv.i16",
    "kv.u32",
    "kv.i32",
    "kv.f32",
    "kv.u64",
    "kv.i64",
    "kv.f64",
    "kv.bool",
    "kv.str",
    "kv.arr_i32",
    "kv.arr_str",
    "golden.types",
];
const GAUSSIAN_DATA_OFFSET: usize = 4576;
const GAUSSIAN_LEN: usize = 1153568;

/// `quant-adversarial.gguf`: (name, ggml type id, shape, offset), from an independent Python parse.
const ADVERSARIAL_TENSORS: &[(&str, u32, &[usize], usize)] = &[
    ("input", 0, &[768, 16], 0),
    ("imatrix", 0, &[768], 49152),
    ("q.f16", 1, &[768, 16], 52224),
    ("dq.f16", 0, &[768, 16], 76800),
    ("q.q4_0", 2, &[768, 16], 125952),
    ("dq.q4_0", 0, &[768, 16], 132864),
    ("qi.q4_0", 2, &[768, 16], 182016),
    ("q.q4_1", 3, &[768, 16], 188928),
    ("dq.q4_1", 0, &[768, 16], 196608),
    ("qi.q4_1", 3, &[768, 16], 245760),
    ("q.q5_0", 6, &[768, 16], 253440),
    ("dq.q5_0", 0, &[768, 16], 261888),
    ("qi.q5_0", 6, &[768, 16], 311040),
    ("q.q5_1", 7, &[768, 16], 319488),
    ("dq.q5_1", 0, &[768, 16], 328704),
    ("qi.q5_1", 7, &[768, 16], 377856),
    ("q.q8_0", 8, &[768, 16], 387072),
    ("dq.q8_0", 0, &[768, 16], 400128),
    ("qi.q8_0", 8, &[768, 16], 449280),
    ("q.q8_1", 9, &[768, 16], 462336),
    ("q.q2_K", 10, &[768, 16], 476160),
    ("dq.q2_K", 0, &[768, 16], 480192),
    ("qi.q2_K", 10, &[768, 16], 529344),
    ("q.q3_K", 11, &[768, 16], 533376),
    ("dq.q3_K", 0, &[768, 16], 538656),
    ("qi.q3_K", 11, &[768, 16], 587808),
    ("q.q4_K", 12, &[768, 16], 593088),
    ("dq.q4_K", 0, &[768, 16], 600000),
    ("qi.q4_K", 12, &[768, 16], 649152),
    ("q.q5_K", 13, &[768, 16], 656064),
    ("dq.q5_K", 0, &[768, 16], 664512),
    ("qi.q5_K", 13, &[768, 16], 713664),
    ("q.q6_K", 14, &[768, 16], 722112),
    ("dq.q6_K", 0, &[768, 16], 732192),
    ("qi.q6_K", 14, &[768, 16], 781344),
    ("q.iq2_xxs", 16, &[768, 16], 791424),
    ("dq.iq2_xxs", 0, &[768, 16], 794592),
    ("q.iq2_xs", 17, &[768, 16], 843744),
    ("dq.iq2_xs", 0, &[768, 16], 847296),
    ("q.iq3_xxs", 18, &[768, 16], 896448),
    ("dq.iq3_xxs", 0, &[768, 16], 901152),
    ("qi.iq3_xxs", 18, &[768, 16], 950304),
    ("q.iq1_s", 19, &[768, 16], 955008),
    ("dq.iq1_s", 0, &[768, 16], 957408),
    ("q.iq4_nl", 20, &[768, 16], 1006560),
    ("dq.iq4_nl", 0, &[768, 16], 1013472),
    ("qi.iq4_nl", 20, &[768, 16], 1062624),
    ("q.iq3_s", 21, &[768, 16], 1069536),
    ("dq.iq3_s", 0, &[768, 16], 1074816),
    ("qi.iq3_s", 21, &[768, 16], 1123968),
    ("q.iq2_s", 22, &[768, 16], 1129248),
    ("dq.iq2_s", 0, &[768, 16], 1133184),
    ("qi.iq2_s", 22, &[768, 16], 1182336),
    ("q.iq4_xs", 23, &[768, 16], 1186272),
    ("dq.iq4_xs", 0, &[768, 16], 1192800),
    ("qi.iq4_xs", 23, &[768, 16], 1241952),
    ("q.iq1_m", 29, &[768, 16], 1248480),
    ("dq.iq1_m", 0, &[768, 16], 1251168),
    ("qi.iq1_m", 29, &[768, 16], 1300320),
    ("q.bf16", 30, &[768, 16], 1303008),
    ("dq.bf16", 0, &[768, 16], 1327584),
    ("q.tq1_0", 34, &[768, 16], 1376736),
    ("dq.tq1_0", 0, &[768, 16], 1379328),
    ("qi.tq1_0", 34, &[768, 16], 1428480),
    ("q.tq2_0", 35, &[768, 16], 1431072),
    ("dq.tq2_0", 0, &[768, 16], 1434240),
    ("qi.tq2_0", 35, &[768, 16], 1483392),
    ("q.mxfp4", 39, &[768, 16], 1486560),
    ("dq.mxfp4", 0, &[768, 16], 1493088),
    ("qi.mxfp4", 39, &[768, 16], 1542240),
    ("q.nvfp4", 40, &[768, 16], 1548768),
    ("dq.nvfp4", 0, &[768, 16], 1555680),
    ("qi.nvfp4", 40, &[768, 16], 1604832),
    ("q.q1_0", 41, &[768, 16], 1611744),
    ("dq.q1_0", 0, &[768, 16], 1613472),
    ("qi.q1_0", 41, &[768, 16], 1662624),
    ("q.q2_0", 42, &[768, 16], 1664352),
    ("dq.q2_0", 0, &[768, 16], 1667808),
    ("qi.q2_0", 42, &[768, 16], 1716960),
];
const ADVERSARIAL_KEYS: &[&str] = &[
    "golden.generator",
    "golden.seed",
    "golden.mode",
    "golden.nrows",
    "golden.n_per_row",
    "kv.u8",
    "kv.i8",
    "kv.u16",
    "kv.i16",
    "kv.u32",
    "kv.i32",
    "kv.f32",
    "kv.u64",
    "kv.i64",
    "kv.f64",
    "kv.bool",
    "kv.str",
    "kv.arr_i32",
    "kv.arr_str",
    "golden.types",
];
const ADVERSARIAL_DATA_OFFSET: usize = 4576;
const ADVERSARIAL_LEN: usize = 1724992;
