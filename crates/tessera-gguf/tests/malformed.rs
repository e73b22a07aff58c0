//! Malformed files: one test per check, each asserting the specific error; a truncation sweep;
//! and a byte-flipping fuzz loop. A malformed file must give an error, never a panic.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use common::{Raw, XorShift};
use tessera::DType;
use tessera_gguf::{dump, GgufError, GgufFile, GgufWriter, Value, ValueType};

fn err(bytes: Vec<u8>) -> GgufError {
    match GgufFile::from_bytes(bytes) {
        Ok(f) => panic!("expected an error, parsed {f:?}"),
        Err(e) => e,
    }
}

/// Asserts `e` matches `pat` and that its message contains each of `needles`.
macro_rules! assert_err {
    ($e:expr, $pat:pat, $($needle:expr),* $(,)?) => {{
        let e = $e;
        assert!(matches!(e, $pat), "unexpected error: {e:?}");
        let msg = e.to_string();
        $(assert!(msg.contains($needle), "message {msg:?} lacks {:?}", $needle);)*
    }};
}

/// A file with one tensor `t` (f32 [8], 32 bytes) and the given extra metadata already written
/// by `kv` (which must write `n_kv` entries).
fn one_tensor(n_kv: u64, kv: impl FnOnce(&mut Raw)) -> Vec<u8> {
    let mut r = Raw::header(3, 1, n_kv);
    kv(&mut r);
    r.tensor("t", &[8], 0, 0).pad(32).data(32);
    r.done()
}

/// A file whose only tensor info is written by `info`, followed by padding and `data` bytes.
fn tensor_file(info: impl FnOnce(&mut Raw), data: usize) -> Vec<u8> {
    let mut r = Raw::header(3, 1, 0);
    info(&mut r);
    r.pad(32).data(data);
    r.done()
}

/// A valid file with every value type and a few tensors, the last one not a multiple of the
/// alignment long (so that the file ends in padding).
fn valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_kv("a.u8", Value::U8(1));
    w.add_kv("a.i8", Value::I8(-1));
    w.add_kv("a.u16", Value::U16(2));
    w.add_kv("a.i16", Value::I16(-2));
    w.add_kv("a.u32", Value::U32(3));
    w.add_kv("a.i32", Value::I32(-3));
    w.add_kv("a.f32", Value::F32(0.5));
    w.add_kv("a.bool", Value::Bool(true));
    w.add_kv("a.str", Value::from("ünï"));
    w.add_kv("a.u64", Value::U64(4));
    w.add_kv("a.i64", Value::I64(-4));
    w.add_kv("a.f64", Value::F64(0.25));
    w.add_kv(
        "a.arr_str",
        Value::Array(ValueType::String, vec!["x".into(), "".into(), "yz".into()]),
    );
    w.add_kv(
        "a.arr_bool",
        Value::Array(ValueType::Bool, vec![Value::Bool(false), Value::Bool(true)]),
    );
    w.add_kv(
        "a.arr_u16",
        Value::Array(ValueType::U16, vec![Value::U16(7); 3]),
    );
    w.add_tensor("f32", DType::F32, &[4, 2], &[1; 32]).unwrap();
    w.add_tensor("q4_0", DType::Q4_0, &[32, 2], &[2; 36])
        .unwrap();
    w.add_tensor("q4_K", DType::Q4K, &[256], &[3; 144]).unwrap();
    w.add_tensor("f16", DType::F16, &[3, 1, 1, 1], &[4; 6])
        .unwrap();
    w.to_bytes().unwrap()
}

#[test]
fn the_helpers_make_valid_files() {
    GgufFile::from_bytes(one_tensor(0, |_| {})).unwrap();
    GgufFile::from_bytes(one_tensor(1, |r| {
        r.kv_u32("general.alignment", 32);
    }))
    .unwrap();
    GgufFile::from_bytes(tensor_file(
        |r| {
            r.tensor("t", &[8], 0, 0);
        },
        32,
    ))
    .unwrap();
    GgufFile::from_bytes(valid_file()).unwrap();
}

// ---- header -------------------------------------------------------------------------------

#[test]
fn bad_magic() {
    let mut b = valid_file();
    b[0..4].copy_from_slice(b"GGML");
    assert_err!(
        err(b),
        GgufError::BadMagic {
            found: [b'G', b'G', b'M', b'L']
        },
        "GGUF"
    );
    // Shorter than the magic.
    assert_err!(
        err(b"GG".to_vec()),
        GgufError::Truncated { offset: 0, .. },
        "magic"
    );
    assert_err!(err(vec![]), GgufError::Truncated { .. }, "magic");
}

#[test]
fn unsupported_versions() {
    for v in [0u32, 1, 4, 0x0300_0000] {
        let mut b = valid_file();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        let e = err(b);
        assert!(
            matches!(e, GgufError::UnsupportedVersion(x) if x == v),
            "{e:?}"
        );
        assert!(e.to_string().contains(&v.to_string()), "{e}");
    }
    let mut b = valid_file();
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(err(b).to_string().contains("big-endian"));
}

#[test]
fn implausible_counts() {
    // More metadata entries than the file could hold: rejected before allocating anything.
    let b = Raw::header(3, 0, u64::MAX).done();
    assert_err!(
        err(b),
        GgufError::CountTooLarge {
            what: "metadata count",
            count: u64::MAX,
            ..
        },
        "18446744073709551615"
    );
    let b = Raw::header(3, 1 << 60, 0).done();
    assert_err!(
        err(b),
        GgufError::CountTooLarge {
            what: "tensor count",
            count: 1152921504606846976,
            ..
        },
        "tensor count"
    );
    // Plausible against the bytes that remain, but the entries are not there.
    let mut r = Raw::header(3, 0, 3);
    r.kv_u32("a", 1).bytes(&[0; 40]);
    assert_err!(err(r.done()), GgufError::EmptyKey { index: 1, .. }, "#1");
}

// ---- metadata -----------------------------------------------------------------------------

#[test]
fn key_length_past_the_end() {
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX).bytes(b"abcdefgh");
    assert_err!(
        err(r.done()),
        GgufError::Truncated {
            offset: 32,
            needed: u64::MAX,
            available: 8,
            ..
        },
        "metadata key #0"
    );
}

#[test]
fn string_value_longer_than_the_file() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).u64(1 << 40).bytes(b"short");
    assert_err!(
        err(r.done()),
        GgufError::Truncated {
            needed: 1099511627776,
            available: 5,
            ..
        },
        "\"k\""
    );
}

#[test]
fn array_count_larger_than_the_file() {
    for (et, size) in [
        (ValueType::U8, 1u64),
        (ValueType::F64, 8),
        (ValueType::String, 8),
    ] {
        let mut r = Raw::header(3, 0, 1);
        r.str("arr")
            .u32(9)
            .u32(et.id())
            .u64(1 << 62)
            .bytes(&[0; 64]);
        let e = err(r.done());
        assert!(
            matches!(e, GgufError::Truncated { needed, available: 64, .. } if needed == (1u64 << 62).saturating_mul(size)),
            "{e:?}"
        );
        assert!(e.to_string().contains("arr"), "{e}");
    }
    // Just one element too many.
    let mut r = Raw::header(3, 0, 1);
    r.str("arr")
        .u32(9)
        .u32(ValueType::U32.id())
        .u64(3)
        .u32(1)
        .u32(2);
    assert_err!(
        err(r.done()),
        GgufError::Truncated {
            needed: 12,
            available: 8,
            ..
        },
        "arr"
    );
}

#[test]
fn unknown_value_types() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(13).u32(0);
    assert_err!(
        err(r.done()),
        GgufError::UnknownValueType {
            id: 13,
            offset: 33,
            ..
        },
        "13",
        "\"k\""
    );
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(0xdead).u64(0);
    assert_err!(
        err(r.done()),
        GgufError::UnknownValueType { id: 0xdead, .. },
        "57005"
    );
}

#[test]
fn nested_array() {
    let mut r = Raw::header(3, 0, 1);
    r.str("outer").u32(9).u32(9).u64(1).u32(4).u64(1).u32(7);
    assert_err!(err(r.done()), GgufError::NestedArray { .. }, "outer");
}

#[test]
fn invalid_utf8() {
    // In a key.
    let mut r = Raw::header(3, 0, 1);
    r.str_bytes(b"ke\xffy").u32(0).u8(0);
    assert_err!(
        err(r.done()),
        GgufError::InvalidUtf8 {
            offset: 32,
            valid_up_to: 2,
            ..
        },
        "metadata key #0"
    );
    // In a string value.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).str_bytes(b"\xc3(");
    assert_err!(err(r.done()), GgufError::InvalidUtf8 { .. }, "\"k\"");
    // In an array of strings.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(8).u64(2).str("ok").str_bytes(b"\x80");
    assert_err!(err(r.done()), GgufError::InvalidUtf8 { .. }, "\"k\"");
    // In a tensor name.
    let b = tensor_file(
        |r| {
            r.str_bytes(b"t\xfe").u32(1).u64(8).u32(0).u64(0);
        },
        32,
    );
    assert_err!(err(b), GgufError::InvalidUtf8 { .. }, "tensor #0");
}

#[test]
fn duplicate_key() {
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("dup", 1).kv_u32("dup", 2);
    assert_err!(
        err(r.done()),
        GgufError::DuplicateKey { offset: 43, .. },
        "dup"
    );
}

#[test]
fn empty_key() {
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("", 1);
    assert_err!(
        err(r.done()),
        GgufError::EmptyKey {
            index: 0,
            offset: 24
        },
        "empty"
    );
}

#[test]
fn invalid_bool() {
    let mut r = Raw::header(3, 0, 1);
    r.str("b").u32(7).u8(2);
    assert_err!(
        err(r.done()),
        GgufError::InvalidBool {
            value: 2,
            offset: 37,
            ..
        },
        "\"b\""
    );
    let mut r = Raw::header(3, 0, 1);
    r.str("b").u32(9).u32(7).u64(2).u8(1).u8(0xff);
    assert_err!(
        err(r.done()),
        GgufError::InvalidBool { value: 255, .. },
        "255"
    );
}

#[test]
fn alignment_key() {
    // Must be a u32.
    let b = one_tensor(1, |r| {
        r.str("general.alignment").u32(10).u64(32);
    });
    assert_err!(
        err(b),
        GgufError::AlignmentType {
            found: ValueType::U64
        },
        "u64"
    );
    let b = one_tensor(1, |r| {
        r.str("general.alignment").u32(5).u32(32);
    });
    assert_err!(
        err(b),
        GgufError::AlignmentType {
            found: ValueType::I32
        },
        "i32"
    );
    // Must be a nonzero power of two.
    for a in [0u32, 3, 48, u32::MAX] {
        let b = one_tensor(1, |r| {
            r.kv_u32("general.alignment", a);
        });
        let e = err(b);
        assert!(
            matches!(e, GgufError::BadAlignment(x) if x == u64::from(a)),
            "{e:?}"
        );
    }
    // A large power of two is fine, and is honoured.
    let mut r = Raw::header(3, 1, 1);
    r.kv_u32("general.alignment", 1 << 12)
        .tensor("t", &[8], 0, 0)
        .pad(4096)
        .data(32);
    let f = GgufFile::from_bytes(r.done()).unwrap();
    assert_eq!((f.alignment, f.data_offset), (4096, 4096));
}

// ---- tensor infos -------------------------------------------------------------------------

#[test]
fn too_many_dims_and_no_dims() {
    let b = tensor_file(
        |r| {
            r.tensor("t", &[1, 1, 1, 1, 8], 0, 0);
        },
        32,
    );
    assert_err!(
        err(b),
        GgufError::TooManyDims { n_dims: 5, .. },
        "\"t\"",
        "5"
    );
    // A huge n_dims is rejected before anything is read for it.
    let b = tensor_file(
        |r| {
            r.str("t").u32(u32::MAX);
        },
        64,
    );
    assert_err!(
        err(b),
        GgufError::TooManyDims {
            n_dims: 4294967295,
            ..
        },
        "4294967295"
    );
    let b = tensor_file(
        |r| {
            r.tensor("t", &[], 0, 0);
        },
        32,
    );
    assert_err!(err(b), GgufError::NoDims { .. }, "\"t\"");
}

#[test]
fn negative_dim() {
    let b = tensor_file(
        |r| {
            r.tensor("t", &[8, u64::MAX], 0, 0);
        },
        32,
    );
    assert_err!(
        err(b),
        GgufError::NegativeDim {
            dim: 1,
            value: -1,
            ..
        },
        "ne[1] = -1"
    );
}

#[test]
fn size_overflow() {
    // Element count past i64::MAX.
    let b = tensor_file(
        |r| {
            r.tensor("t", &[1 << 32, 1 << 32], 0, 0);
        },
        32,
    );
    assert_err!(
        err(b),
        GgufError::SizeOverflow {
            what: "element count",
            ..
        },
        "\"t\""
    );
    let b = tensor_file(
        |r| {
            r.tensor("t", &[1 << 20, 1 << 20, 1 << 20, 1 << 20], 8, 0);
        },
        32,
    );
    assert_err!(err(b), GgufError::SizeOverflow { .. }, "\"t\"");
    // Element count fine, byte count not.
    let b = tensor_file(
        |r| {
            r.tensor("t", &[1 << 62], DType::F64.id(), 0);
        },
        32,
    );
    assert_err!(
        err(b),
        GgufError::SizeOverflow {
            what: "byte size",
            dtype: DType::F64,
            ..
        },
        "f64"
    );
}

#[test]
fn row_not_block_multiple() {
    let b = tensor_file(
        |r| {
            r.tensor("q", &[33, 2], DType::Q4_0.id(), 0);
        },
        128,
    );
    assert_err!(
        err(b),
        GgufError::RowNotBlockMultiple {
            dtype: DType::Q4_0,
            ne0: 33,
            block: 32,
            ..
        },
        "\"q\"",
        "33",
        "32"
    );
    let b = tensor_file(
        |r| {
            r.tensor("k", &[128], DType::Q6K.id(), 0);
        },
        256,
    );
    assert_err!(
        err(b),
        GgufError::RowNotBlockMultiple { block: 256, .. },
        "q6_K"
    );
}

#[test]
fn unknown_tensor_type() {
    for id in [4u32, 5, 31, 36, 43, 1000, u32::MAX] {
        let b = tensor_file(
            |r| {
                r.tensor("t", &[8], id, 0);
            },
            32,
        );
        let e = err(b);
        assert!(
            matches!(&e, GgufError::UnknownTensorType { tensor, id: x } if tensor == "t" && *x == id),
            "{e:?}"
        );
        assert!(e.to_string().contains(&id.to_string()), "{e}");
    }
}

#[test]
fn misaligned_offset() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[4], 0, 0)
        .tensor("b", &[4], 0, 16)
        .pad(32)
        .data(64);
    assert_err!(
        err(r.done()),
        GgufError::Misaligned {
            offset: 16,
            alignment: 32,
            ..
        },
        "\"b\""
    );
    // With general.alignment = 16 the same offsets are fine.
    let mut r = Raw::header(3, 2, 1);
    r.kv_u32("general.alignment", 16)
        .tensor("a", &[4], 0, 0)
        .tensor("b", &[4], 0, 16)
        .pad(16)
        .data(32);
    GgufFile::from_bytes(r.done()).unwrap();
}

#[test]
fn data_out_of_bounds() {
    // One byte short.
    let b = tensor_file(
        |r| {
            r.tensor("t", &[8], 0, 0);
        },
        31,
    );
    assert_err!(
        err(b),
        GgufError::DataOutOfBounds {
            offset: 0,
            size: 32,
            data_len: 31,
            ..
        },
        "\"t\""
    );
    // Offset past the end.
    let b = tensor_file(
        |r| {
            r.tensor("t", &[8], 0, 64);
        },
        64,
    );
    assert_err!(
        err(b),
        GgufError::DataOutOfBounds { offset: 64, .. },
        "\"t\""
    );
    // Offset so large that offset + size overflows.
    let b = tensor_file(
        |r| {
            r.tensor("t", &[8], 0, u64::MAX - 31);
        },
        64,
    );
    assert_err!(err(b), GgufError::DataOutOfBounds { .. }, "\"t\"");
    // Tensors but no room even for the padding before the data section.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[0], 0, 0);
    assert_err!(err(r.done()), GgufError::Truncated { .. }, "padding");
}

#[test]
fn overlapping_tensors() {
    // Same offset.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[8], 0, 0)
        .tensor("b", &[8], 0, 0)
        .pad(32)
        .data(64);
    assert_err!(err(r.done()), GgufError::Overlap { .. }, "\"a\"", "\"b\"");
    // Partial overlap, out of order: c = [0, 64), a = [32, 64).
    let mut r = Raw::header(3, 3, 0);
    r.tensor("a", &[8], 0, 32)
        .tensor("z", &[8], 0, 96)
        .tensor("c", &[16], 0, 0)
        .pad(32)
        .data(128);
    let e = err(r.done());
    match &e {
        GgufError::Overlap {
            a,
            a_range,
            b,
            b_range,
        } => {
            assert_eq!((a.as_str(), a_range.clone()), ("c", 0..64));
            assert_eq!((b.as_str(), b_range.clone()), ("a", 32..64));
        }
        _ => panic!("{e:?}"),
    }
    // One tensor inside another, with a third between them in offset order.
    let mut r = Raw::header(3, 3, 0);
    r.tensor("big", &[64], 0, 0)
        .tensor("x", &[8], 0, 32)
        .tensor("y", &[8], 0, 128)
        .pad(32)
        .data(256);
    assert_err!(err(r.done()), GgufError::Overlap { .. }, "big");
    // Empty tensors overlap nothing.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[8], 0, 0)
        .tensor("e", &[0, 3], 0, 0)
        .pad(32)
        .data(32);
    GgufFile::from_bytes(r.done()).unwrap();
}

#[test]
fn duplicate_tensor_name() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("w", &[8], 0, 0)
        .tensor("w", &[8], 0, 32)
        .pad(32)
        .data(64);
    let e = err(r.done());
    assert!(
        matches!(&e, GgufError::DuplicateTensor(n) if n == "w"),
        "{e:?}"
    );
    assert!(e.to_string().contains("\"w\""), "{e}");
}

#[test]
fn tensor_name_too_long() {
    let name = "n".repeat(64);
    let b = tensor_file(
        |r| {
            r.tensor(&name, &[8], 0, 0);
        },
        32,
    );
    assert_err!(
        err(b),
        GgufError::NameTooLong {
            len: 64,
            max: 63,
            ..
        },
        "64"
    );
}

// ---- sweeps -------------------------------------------------------------------------------

/// Every prefix of a valid file is an error, until the last tensor's data is complete (only
/// trailing padding may be missing).
#[test]
fn truncated_at_every_length() {
    let full = valid_file();
    let f = GgufFile::from_bytes(full.clone()).unwrap();
    let data_end = f.data_offset + f.tensors.iter().map(|t| t.offset + t.size).max().unwrap();
    assert!(data_end < full.len(), "the test file should end in padding");
    for len in 0..=full.len() {
        let cut = full[..len].to_vec();
        let r = catch_unwind(|| GgufFile::from_bytes(cut));
        match r {
            Err(_) => panic!("panicked on the file truncated to {len} bytes"),
            Ok(Ok(_)) if len < data_end => panic!("accepted the file truncated to {len} bytes"),
            Ok(Err(e)) if len >= data_end => panic!("rejected {len} bytes: {e}"),
            Ok(_) => {}
        }
    }
}

/// Flips random bytes of a valid file (mostly in the header and tables, where the structure
/// is). Nothing may panic; whatever parses must be self-consistent and re-writable.
#[test]
fn random_byte_flips_never_panic() {
    let base = valid_file();
    let f = GgufFile::from_bytes(base.clone()).unwrap();
    let header_len = f.data_offset;
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let (mut ok, mut errors) = (0, 0);
    for iter in 0..4000 {
        let mut b = base.clone();
        let flips = 1 + rng.below(4);
        for _ in 0..flips {
            let pos = if rng.below(10) < 9 {
                rng.below(header_len)
            } else {
                rng.below(b.len())
            };
            // Sometimes a random byte, sometimes a single bit, sometimes 0xff (big counts).
            b[pos] = match rng.below(3) {
                0 => rng.next() as u8,
                1 => b[pos] ^ (1 << rng.below(8)),
                _ => 0xff,
            };
        }
        if rng.below(8) == 0 {
            let len = rng.below(b.len());
            b.truncate(len);
        }
        let result = catch_unwind(AssertUnwindSafe(|| {
            let parsed = GgufFile::from_bytes(b.clone());
            if let Ok(f) = &parsed {
                // Everything a parsed file promises must hold.
                for t in &f.tensors {
                    assert_eq!(f.tensor_data(t).len(), t.size);
                    assert_eq!(t.offset % f.alignment, 0);
                    assert_eq!(f.tensor(&t.name), Some(t));
                }
                for (k, v) in &f.metadata {
                    assert_eq!(f.get(k), Some(v));
                }
                let _ = dump(f);
                let again = GgufWriter::from_gguf(f).unwrap().to_bytes().unwrap();
                GgufFile::from_bytes(again).unwrap();
            }
            parsed.is_ok()
        }));
        match result {
            Ok(true) => ok += 1,
            Ok(false) => errors += 1,
            Err(_) => panic!("iteration {iter}: panicked on {b:02x?}"),
        }
    }
    eprintln!("fuzz: {ok} parsed, {errors} rejected");
    // Both outcomes should be well represented, or the fuzzer is not exercising anything.
    assert!(ok > 100 && errors > 1000, "ok {ok}, errors {errors}");
}
