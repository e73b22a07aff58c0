//! Write-then-read round trips: every value type, arrays, every tensor type, alignments, and
//! byte-identical re-writes.

mod common;

use common::{Raw, XorShift};
use tessera::DType;
use tessera_gguf::{dump, GgufError, GgufFile, GgufWriter, Value, ValueType};

/// One value of every scalar type, a string, and arrays of every element type.
fn all_values() -> Vec<(String, Value)> {
    let mut kv: Vec<(String, Value)> = vec![
        ("t.u8".into(), Value::U8(250)),
        ("t.i8".into(), Value::I8(-128)),
        ("t.u16".into(), Value::U16(65535)),
        ("t.i16".into(), Value::I16(-32768)),
        ("t.u32".into(), Value::U32(u32::MAX)),
        ("t.i32".into(), Value::I32(i32::MIN)),
        ("t.f32".into(), Value::F32(-1.5e-30)),
        ("t.bool_t".into(), Value::Bool(true)),
        ("t.bool_f".into(), Value::Bool(false)),
        ("t.string".into(), Value::from("ünïcode ✓ \"quoted\"\n")),
        ("t.empty_string".into(), Value::from("")),
        ("t.u64".into(), Value::U64(u64::MAX)),
        ("t.i64".into(), Value::I64(i64::MIN)),
        ("t.f64".into(), Value::F64(f64::MIN_POSITIVE)),
    ];
    let scalars: Vec<Value> = kv.iter().map(|(_, v)| v.clone()).collect();
    for t in ValueType::ALL {
        if t == ValueType::Array {
            continue;
        }
        let items: Vec<Value> = scalars
            .iter()
            .filter(|v| v.value_type() == t)
            .cloned()
            .cycle()
            .take(11)
            .collect();
        kv.push((format!("arr.{t}"), Value::Array(t, items)));
        kv.push((format!("arr_empty.{t}"), Value::Array(t, vec![])));
    }
    kv
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut r = XorShift(seed | 1);
    (0..n).map(|_| r.next() as u8).collect()
}

/// A writer with every value type and one tensor of every type, with shapes of 1 to 4 dims.
fn writer_with_everything(alignment: Option<u32>) -> GgufWriter {
    let mut w = GgufWriter::new();
    if let Some(a) = alignment {
        w.set_alignment(a);
    }
    for (k, v) in all_values() {
        w.add_kv(&k, v);
    }
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        let b = dtype.block_size();
        let ne: Vec<usize> = match i % 4 {
            0 => vec![b * 3],
            1 => vec![b, 3],
            2 => vec![b * 2, 1, 3],
            _ => vec![b, 2, 1, 2],
        };
        let rows: usize = ne[1..].iter().product();
        let size = dtype.row_size(ne[0]).unwrap() * rows;
        w.add_tensor(
            &format!("t.{}", dtype.name()),
            dtype,
            &ne,
            &pattern(size, i as u64),
        )
        .unwrap();
    }
    w
}

fn check_everything(f: &GgufFile, alignment: usize) {
    assert_eq!(f.alignment, alignment);
    assert_eq!(f.data_offset % alignment, 0);
    // Metadata: same keys, same values, same order (after general.alignment if set).
    let expected = all_values();
    let got: Vec<&(String, Value)> = f
        .metadata
        .iter()
        .filter(|(k, _)| k != "general.alignment")
        .collect();
    assert_eq!(got.len(), expected.len());
    for ((gk, gv), (ek, ev)) in got.iter().map(|kv| (&kv.0, &kv.1)).zip(&expected) {
        assert_eq!(gk, ek);
        assert_eq!(gv, ev, "key {ek}");
        assert_eq!(f.get(ek), Some(ev));
    }
    assert_eq!(f.get("no.such.key"), None);
    // Tensors.
    assert_eq!(f.tensors.len(), DType::ALL.len());
    for (i, dtype) in DType::ALL.into_iter().enumerate() {
        let t = f.tensor(&format!("t.{}", dtype.name())).unwrap();
        assert_eq!(t.dtype, dtype);
        assert_eq!(t.n_dims, i % 4 + 1);
        assert_eq!(t.offset % alignment, 0);
        assert_eq!(f.tensor_data(t), &pattern(t.size, i as u64)[..]);
        assert_eq!(t.n_elements(), t.ne.iter().product::<usize>());
        assert_eq!(t.n_elements() % dtype.block_size(), 0);
    }
    assert_eq!(f.tensor("nope"), None);
}

#[test]
fn every_value_and_tensor_type_round_trips_with_default_alignment() {
    let w = writer_with_everything(None);
    assert_eq!(w.alignment().unwrap(), 32);
    let bytes = w.to_bytes().unwrap();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert!(!f.is_mmapped());
    assert_eq!(f.version, 3);
    check_everything(&f, 32);
    assert_eq!(f.get("general.alignment"), None);
    // Re-writing what was read gives the same bytes.
    assert_eq!(
        GgufWriter::from_gguf(&f).unwrap().to_bytes().unwrap(),
        bytes
    );
    // The file ends padded, as ggml writes it.
    assert_eq!(bytes.len() % 32, 0);
}

#[test]
fn custom_alignments_round_trip() {
    for a in [1u32, 2, 8, 64, 256, 4096] {
        let w = writer_with_everything(Some(a));
        let bytes = w.to_bytes().unwrap();
        let f = GgufFile::from_bytes(bytes.clone()).unwrap();
        check_everything(&f, a as usize);
        assert_eq!(f.get("general.alignment"), Some(&Value::U32(a)));
        assert_eq!(
            GgufWriter::from_gguf(&f).unwrap().to_bytes().unwrap(),
            bytes,
            "alignment {a}"
        );
    }
}

#[test]
fn write_file_then_open_with_mmap() {
    let dir = std::env::temp_dir().join(format!("tessera-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("everything.gguf");
    let w = writer_with_everything(Some(64));
    w.write_file(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert!(f.is_mmapped());
    check_everything(&f, 64);
    assert_eq!(f.bytes(), &w.to_bytes().unwrap()[..]);
    assert!(format!("{f:?}").contains("n_tensors"));
    // Releasing mapped pages changes no byte (they fault back in from the file); a range past
    // the end is an error.
    let n = f.bytes().len();
    f.release(1, n - 1).unwrap();
    assert_eq!(f.bytes(), &w.to_bytes().unwrap()[..]);
    let e = f.release(n - 4, 8).unwrap_err().to_string();
    assert!(e.contains("run past"), "{e}");

    // An empty file is a clean error, not a failed mmap.
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&empty),
        Err(GgufError::Truncated { .. })
    ));
    // A missing file is an I/O error.
    assert!(matches!(
        GgufFile::open(dir.join("missing.gguf")),
        Err(GgufError::Io(_))
    ));
    // A writer that cannot be written does not create (or clobber) the file.
    let mut bad = GgufWriter::new();
    bad.set_alignment(3);
    let bad_path = dir.join("bad.gguf");
    assert!(matches!(
        bad.write_file(&bad_path),
        Err(GgufError::BadAlignment(3))
    ));
    assert!(!bad_path.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn version_2_reads_like_version_3() {
    let mut bytes = writer_with_everything(None).to_bytes().unwrap();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.version, 2);
    check_everything(&f, 32);
}

#[test]
fn empty_file_and_empty_tensor() {
    // No metadata, no tensors.
    let bytes = GgufWriter::new().to_bytes().unwrap();
    assert_eq!(bytes.len(), 32); // 24-byte header padded to 32, as ggml does.
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert!(f.metadata.is_empty() && f.tensors.is_empty());
    // Without tensors the data section starts right after the header (ggml does the same).
    assert_eq!(f.data_offset, 24);
    // Same file without the padding.
    let f = GgufFile::from_bytes(Raw::header(3, 0, 0).done()).unwrap();
    assert_eq!(f.data_offset, 24);

    // Zero-element tensors take no bytes and overlap nothing.
    let mut w = GgufWriter::new();
    w.add_tensor("a", DType::F32, &[4, 0], &[]).unwrap();
    w.add_tensor("b", DType::F32, &[4], &[1; 16]).unwrap();
    w.add_tensor("c", DType::Q4_0, &[0, 7], &[]).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.tensor("a").unwrap().size, 0);
    assert_eq!(f.tensor("a").unwrap().n_elements(), 0);
    assert_eq!(f.tensor_data_by_name("b"), Some(&[1u8; 16][..]));
    assert_eq!(f.tensor_data_by_name("c"), Some(&[][..]));
}

#[test]
fn tensors_in_any_order_with_gaps_are_accepted() {
    // ggml requires back-to-back offsets in order; we only require aligned, in bounds, disjoint.
    let mut r = Raw::header(3, 3, 0);
    r.tensor("late", &[8], 0, 96) // f32 x 8 = 32 bytes at 96
        .tensor("early", &[8], 0, 0)
        .tensor("mid", &[16], 0, 32) // 64 bytes at 32..96: touches both neighbours
        .pad(32);
    let data_start = r.b.len();
    r.data(128);
    let f = GgufFile::from_bytes(r.done()).unwrap();
    assert_eq!(f.data_offset, data_start);
    assert_eq!(f.tensors[0].name, "late");
    assert_eq!(f.tensor_data(&f.tensors[0])[0], 96);
    assert_eq!(f.tensor_data(&f.tensors[1])[0], 0);
    // Re-writing puts them back to back in table order.
    let re = GgufFile::from_bytes(GgufWriter::from_gguf(&f).unwrap().to_bytes().unwrap()).unwrap();
    let offsets: Vec<usize> = re.tensors.iter().map(|t| t.offset).collect();
    assert_eq!(offsets, [0, 32, 64]);
    for (a, b) in f.tensors.iter().zip(&re.tensors) {
        assert_eq!(f.tensor_data(a), re.tensor_data(b));
    }
}

#[test]
fn add_kv_twice_replaces_in_place() {
    let mut w = GgufWriter::new();
    w.add_kv("a", Value::U8(1));
    w.add_kv("b", Value::U8(2));
    w.add_kv("a", Value::from("x"));
    assert_eq!(w.get("a"), Some(&Value::from("x")));
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let keys: Vec<&str> = f.metadata.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(f.get("a").and_then(Value::as_str), Some("x"));
}

#[test]
fn writer_rejects_bad_input() {
    let mut w = GgufWriter::new();
    w.add_tensor("x", DType::F32, &[2], &[0; 8]).unwrap();
    let e = w.add_tensor("x", DType::F32, &[2], &[0; 8]).unwrap_err();
    assert!(
        matches!(&e, GgufError::DuplicateTensor(n) if n == "x"),
        "{e}"
    );
    let e = w.add_tensor("y", DType::F32, &[2], &[0; 7]).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::DataSizeMismatch {
                expected: 8,
                actual: 7,
                ..
            }
        ),
        "{e}"
    );
    let e = w.add_tensor("y", DType::Q4_0, &[33], &[]).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::RowNotBlockMultiple {
                ne0: 33,
                block: 32,
                ..
            }
        ),
        "{e}"
    );
    let e = w
        .add_tensor("y", DType::F32, &[1, 1, 1, 1, 1], &[0; 4])
        .unwrap_err();
    assert!(matches!(e, GgufError::TooManyDims { n_dims: 5, .. }), "{e}");
    let e = w.add_tensor("y", DType::F32, &[], &[]).unwrap_err();
    assert!(matches!(e, GgufError::NoDims { .. }), "{e}");
    let e = w
        .add_tensor(&"n".repeat(64), DType::F32, &[1], &[0; 4])
        .unwrap_err();
    assert!(matches!(e, GgufError::NameTooLong { len: 64, .. }), "{e}");
    let e = w
        .add_tensor("y", DType::F32, &[1 << 32, 1 << 32], &[])
        .unwrap_err();
    assert!(matches!(e, GgufError::SizeOverflow { .. }), "{e}");
    w.add_tensor(&"n".repeat(63), DType::F32, &[1], &[0; 4])
        .unwrap();

    let bad_kv = |k: &str, v: Value| {
        let mut w = GgufWriter::new();
        w.add_kv(k, v);
        w.to_bytes().unwrap_err()
    };
    assert!(matches!(
        bad_kv("", Value::U8(0)),
        GgufError::EmptyKey { .. }
    ));
    assert!(matches!(
        bad_kv("a", Value::Array(ValueType::Array, vec![])),
        GgufError::NestedArray { .. }
    ));
    let e = bad_kv(
        "a",
        Value::Array(ValueType::U8, vec![Value::U8(1), Value::I8(1)]),
    );
    assert!(
        matches!(
            e,
            GgufError::ArrayTypeMismatch {
                index: 1,
                expected: ValueType::U8,
                found: ValueType::I8,
                ..
            }
        ),
        "{e}"
    );
    assert!(matches!(
        bad_kv("general.alignment", Value::U32(0)),
        GgufError::BadAlignment(0)
    ));
    assert!(matches!(
        bad_kv("general.alignment", Value::U32(48)),
        GgufError::BadAlignment(48)
    ));
    assert!(matches!(
        bad_kv("general.alignment", Value::U64(32)),
        GgufError::AlignmentType {
            found: ValueType::U64
        }
    ));
}

#[test]
fn dump_lists_header_metadata_and_tensors() {
    let f = GgufFile::from_bytes(writer_with_everything(None).to_bytes().unwrap()).unwrap();
    let d = dump(&f);
    let n_kv = all_values().len();
    assert!(
        d.starts_with(&format!(
            "GGUF v3: {n_kv} key/value pairs, {} tensors, alignment 32,",
            DType::ALL.len()
        )),
        "{d}"
    );
    let line = |key: &str| {
        d.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(key))
            .unwrap_or_else(|| panic!("no line for {key} in\n{d}"))
            .to_string()
    };
    let ty = |key: &str| line(key).split_whitespace().nth(2).unwrap().to_string();
    assert_eq!(ty("t.u64"), "u64");
    assert!(
        line("t.u64").ends_with(" = 18446744073709551615"),
        "{}",
        line("t.u64")
    );
    assert_eq!(ty("t.string"), "string");
    assert!(line("t.string").ends_with(r#" = "ünïcode ✓ \"quoted\"\n""#));
    assert!(
        line("t.f64").ends_with(" = 2.2250738585072014e-308"),
        "{}",
        line("t.f64")
    );
    assert!(line("arr.i32").contains("[i32; 11]"));
    assert!(
        line("arr.i32").ends_with("... (11 total)]"),
        "{}",
        line("arr.i32")
    );
    assert!(line("arr_empty.string").ends_with("= []"));
    let row = line("t.q4_0");
    let cols: Vec<&str> = row.split_whitespace().collect();
    let t = f.tensor("t.q4_0").unwrap();
    assert_eq!(cols[0], "2");
    assert_eq!(cols[2], "q4_0");
    assert_eq!(cols[3..8].join(" "), "64 x 1 x 3");
    assert_eq!(cols[8], t.size.to_string());
    assert_eq!(cols[9], t.offset.to_string());
}

#[test]
fn dump_never_fails_on_odd_values() {
    let mut w = GgufWriter::new();
    w.add_kv("nan", Value::F32(f32::NAN));
    w.add_kv("long", Value::String("é".repeat(1000)));
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    let d = dump(&f);
    assert!(d.contains("NaN"));
    assert!(d.contains("... (2000 bytes)"));
    assert!(!d.contains("tensors:"));
}
