//! The streaming writer: a file streamed one tensor at a time is byte for byte the file the
//! in-memory writer produces; writing out of order, with a wrong size or finishing early is an
//! error naming the tensor, and an unfinished stream leaves no file behind.

use tessera::DType;
use tessera_gguf::{GgufError, GgufFile, GgufWriter, Value};

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-gguf-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Three tensors of different types and sizes (none a multiple of the alignment).
fn tensors() -> Vec<(&'static str, DType, Vec<usize>, Vec<u8>)> {
    let bytes = |n: usize, seed: u8| (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
    vec![
        ("a.weight", DType::F32, vec![3, 5], bytes(60, 1)),
        ("b.weight", DType::Q8_0, vec![64, 3], bytes(3 * 2 * 34, 2)),
        ("c.bias", DType::F16, vec![7], bytes(14, 3)),
    ]
}

fn base() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::from("test"));
    w.add_kv("test.count", Value::U32(3));
    w
}

#[test]
fn streamed_file_equals_the_in_memory_one() {
    let mut whole = base();
    for (n, t, ne, d) in tensors() {
        whole.add_tensor(n, t, &ne, &d).unwrap();
    }
    let want = whole.to_bytes().unwrap();
    // all declared, streamed
    let mut w = base();
    for (n, t, ne, _) in tensors() {
        w.declare_tensor(n, t, &ne).unwrap();
    }
    let path = tmp("all.gguf");
    let mut s = w.stream_to_file(&path).unwrap();
    for (n, _, _, d) in tensors() {
        assert_eq!(s.next_tensor(), Some(n));
        s.write_tensor(n, &d).unwrap();
    }
    assert_eq!(s.next_tensor(), None);
    s.finish().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), want);
    // the first tensor given with its data, the rest streamed
    let mut w = base();
    for (i, (n, t, ne, d)) in tensors().into_iter().enumerate() {
        if i == 0 {
            w.add_tensor(n, t, &ne, &d).unwrap();
        } else {
            w.declare_tensor(n, t, &ne).unwrap();
        }
    }
    let path2 = tmp("mixed.gguf");
    let mut s = w.stream_to_file(&path2).unwrap();
    for (n, _, _, d) in tensors().into_iter().skip(1) {
        s.write_tensor(n, &d).unwrap();
    }
    s.finish().unwrap();
    assert_eq!(std::fs::read(&path2).unwrap(), want);
    let f = GgufFile::open(&path2).unwrap();
    assert_eq!(f.tensors.len(), 3);
    assert_eq!(
        f.tensor_data(f.tensor("b.weight").unwrap()),
        &tensors()[1].3[..]
    );
}

#[test]
fn stream_errors_name_the_tensor_and_leave_no_file() {
    let declared = || {
        let mut w = base();
        for (n, t, ne, _) in tensors() {
            w.declare_tensor(n, t, &ne).unwrap();
        }
        w
    };
    let msg = |e: GgufError| e.to_string();
    // out of order
    let path = tmp("order.gguf");
    let mut s = declared().stream_to_file(&path).unwrap();
    let e = s.write_tensor("b.weight", &tensors()[1].3).unwrap_err();
    assert!(msg(e).contains("\"b.weight\" written where \"a.weight\""));
    drop(s);
    assert!(!path.exists(), "an unfinished stream removes its file");
    // wrong size
    let path = tmp("size.gguf");
    let mut s = declared().stream_to_file(&path).unwrap();
    let e = s.write_tensor("a.weight", &[0u8; 59]).unwrap_err();
    assert!(msg(e).contains("\"a.weight\" has 59 bytes, 60 were declared"));
    drop(s);
    assert!(!path.exists());
    // finished early
    let path = tmp("early.gguf");
    let mut s = declared().stream_to_file(&path).unwrap();
    s.write_tensor("a.weight", &tensors()[0].3).unwrap();
    let e = s.finish().unwrap_err();
    assert!(msg(e).contains("before tensor \"b.weight\" (and 1 more)"));
    assert!(!path.exists());
    // too many
    let path = tmp("many.gguf");
    let mut s = declared().stream_to_file(&path).unwrap();
    for (n, _, _, d) in tensors() {
        s.write_tensor(n, &d).unwrap();
    }
    assert!(msg(s.write_tensor("d", &[]).unwrap_err()).contains("after all declared"));
    s.finish().unwrap();
    assert!(path.exists());
    // a tensor with data after a declared one; an in-memory write of a declared tensor
    let mut w = base();
    w.declare_tensor("a.weight", DType::F32, &[3, 5]).unwrap();
    w.add_tensor("c.bias", DType::F16, &[7], &[0u8; 14])
        .unwrap();
    assert!(msg(w.to_bytes().unwrap_err()).contains("\"a.weight\" was declared without data"));
    let path = tmp("late.gguf");
    assert!(msg(w.stream_to_file(&path).err().unwrap()).contains("\"c.bias\" has its data"));
    assert!(!path.exists());
    // declarations are checked like add_tensor
    let mut w = base();
    assert!(matches!(
        w.declare_tensor("q", DType::Q8_0, &[33, 2]),
        Err(GgufError::RowNotBlockMultiple { .. })
    ));
    w.declare_tensor("q", DType::Q8_0, &[32, 2]).unwrap();
    assert!(matches!(
        w.declare_tensor("q", DType::F32, &[1]),
        Err(GgufError::DuplicateTensor(_))
    ));
}
