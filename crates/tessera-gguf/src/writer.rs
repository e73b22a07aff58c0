//! The writer.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use tessera::DType;

use crate::{
    GgufError, GgufFile, Value, ValueType, DEFAULT_ALIGNMENT, GGUF_MAGIC, KEY_ALIGNMENT,
    MAX_TENSOR_NAME_LEN,
};

type Result<T> = std::result::Result<T, GgufError>;

struct PendingTensor {
    name: String,
    dtype: DType,
    ne: Vec<usize>,
    /// Bytes of data (checked against the type and dimensions).
    size: usize,
    /// The data, or `None` for a tensor declared for a [`GgufStreamWriter`].
    data: Option<Vec<u8>>,
}

/// Builds a GGUF file (version 3) the way ggml's `gguf_write_to_file` lays it out: header,
/// metadata in insertion order, tensor infos in insertion order, zero padding to the alignment,
/// then each tensor's data followed by zero padding to the alignment. Offsets are assigned
/// contiguously in insertion order, so a file written by ggml and re-written from a
/// `GgufFile` (see [`GgufWriter::from_gguf`]) comes out byte for byte the same.
///
/// The alignment is 32 unless the metadata key `general.alignment` (a `u32`, a power of two)
/// says otherwise.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    kv_index: HashMap<String, usize>,
    tensors: Vec<PendingTensor>,
    tensor_index: HashMap<String, usize>,
}

impl GgufWriter {
    /// An empty file: version 3, no metadata, no tensors, alignment 32.
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer holding a copy of `f`'s metadata (in order) and tensors (in order, data copied).
    pub fn from_gguf(f: &GgufFile) -> Result<Self> {
        let mut w = Self::new();
        for (k, v) in &f.metadata {
            w.add_kv(k, v.clone());
        }
        for t in &f.tensors {
            w.add_tensor(&t.name, t.dtype, t.shape(), f.tensor_data(t))?;
        }
        Ok(w)
    }

    /// Sets metadata key `key` to `value`. A key set twice keeps its first position and takes
    /// the new value. Keys and arrays are validated by `write_to` (non-empty key, array
    /// elements all of the array's element type, no arrays of arrays, a valid alignment).
    pub fn add_kv(&mut self, key: &str, value: Value) {
        match self.kv_index.get(key) {
            Some(&i) => self.metadata[i].1 = value,
            None => {
                self.kv_index.insert(key.to_string(), self.metadata.len());
                self.metadata.push((key.to_string(), value));
            }
        }
    }

    /// Sets `general.alignment` to `alignment` (must be a power of two; checked by `write_to`).
    pub fn set_alignment(&mut self, alignment: u32) {
        self.add_kv(KEY_ALIGNMENT, Value::U32(alignment));
    }

    /// The value of metadata key `key`, if set.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kv_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Adds a tensor of type `dtype` with dimensions `ne` (1 to 4, innermost first) and bytes
    /// `data` (copied). Checks the name (unique, at most 63 bytes), the dimensions, that `ne[0]`
    /// is a multiple of the type's block size, and that `data` has exactly the tensor's size.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dtype: DType,
        ne: &[usize],
        data: &[u8],
    ) -> Result<()> {
        let expected = self.check_tensor(name, dtype, ne)?;
        if data.len() != expected {
            return Err(GgufError::DataSizeMismatch {
                tensor: name.to_string(),
                dtype,
                ne: ne.to_vec(),
                expected,
                actual: data.len(),
            });
        }
        self.push_tensor(name, dtype, ne, expected, Some(data.to_vec()));
        Ok(())
    }

    /// Declares tensor `name` without its data, checked like [`add_tensor`](Self::add_tensor):
    /// its data is written later, in declaration order, through the [`GgufStreamWriter`] that
    /// [`stream_to_file`](Self::stream_to_file) returns — so that a converter holds one tensor
    /// in memory at a time, not the whole file.
    pub fn declare_tensor(&mut self, name: &str, dtype: DType, ne: &[usize]) -> Result<()> {
        let size = self.check_tensor(name, dtype, ne)?;
        self.push_tensor(name, dtype, ne, size, None);
        Ok(())
    }

    fn push_tensor(
        &mut self,
        name: &str,
        dtype: DType,
        ne: &[usize],
        size: usize,
        data: Option<Vec<u8>>,
    ) {
        self.tensor_index
            .insert(name.to_string(), self.tensors.len());
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            dtype,
            ne: ne.to_vec(),
            size,
            data,
        });
    }

    /// Checks a new tensor's name and dimensions; returns its size in bytes.
    fn check_tensor(&self, name: &str, dtype: DType, ne: &[usize]) -> Result<usize> {
        if name.len() > MAX_TENSOR_NAME_LEN {
            return Err(GgufError::NameTooLong {
                tensor: name.to_string(),
                len: name.len(),
                max: MAX_TENSOR_NAME_LEN,
            });
        }
        if self.tensor_index.contains_key(name) {
            return Err(GgufError::DuplicateTensor(name.to_string()));
        }
        if ne.is_empty() {
            return Err(GgufError::NoDims {
                tensor: name.to_string(),
            });
        }
        if ne.len() > 4 {
            return Err(GgufError::TooManyDims {
                tensor: name.to_string(),
                n_dims: ne.len() as u64,
            });
        }
        let overflow = |what| GgufError::SizeOverflow {
            tensor: name.to_string(),
            dtype,
            ne: ne.iter().map(|&n| n as u64).collect(),
            what,
        };
        let n_elements = ne
            .iter()
            .try_fold(1u64, |acc, &n| acc.checked_mul(n as u64))
            .filter(|&n| n <= i64::MAX as u64);
        if n_elements.is_none() {
            return Err(overflow("element count"));
        }
        let Some(row) = dtype.row_size(ne[0]) else {
            return Err(GgufError::RowNotBlockMultiple {
                tensor: name.to_string(),
                dtype,
                ne0: ne[0] as u64,
                block: dtype.block_size(),
            });
        };
        ne[1..]
            .iter()
            .try_fold(row, |acc, &n| acc.checked_mul(n))
            .ok_or_else(|| overflow("byte size"))
    }

    /// Replaces the type, dimensions and data of tensor `name` (keeping its position), or adds
    /// it when absent; checked like [`add_tensor`](Self::add_tensor).
    pub fn replace_tensor(
        &mut self,
        name: &str,
        dtype: DType,
        ne: &[usize],
        data: &[u8],
    ) -> Result<()> {
        let Some(&i) = self.tensor_index.get(name) else {
            return self.add_tensor(name, dtype, ne, data);
        };
        let mut checked = GgufWriter::new();
        checked.add_tensor(name, dtype, ne, data)?;
        self.tensors[i] = checked.tensors.pop().expect("just added");
        Ok(())
    }

    /// The alignment the file will have: `general.alignment` if set (validated), else 32.
    pub fn alignment(&self) -> Result<usize> {
        match self.get(KEY_ALIGNMENT) {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(Value::U32(a)) if a.is_power_of_two() => Ok(*a as usize),
            Some(Value::U32(a)) => Err(GgufError::BadAlignment((*a).into())),
            Some(v) => Err(GgufError::AlignmentType {
                found: v.value_type(),
            }),
        }
    }

    fn validate_metadata(&self) -> Result<()> {
        for (i, (key, value)) in self.metadata.iter().enumerate() {
            if key.is_empty() {
                return Err(GgufError::EmptyKey {
                    index: i as u64,
                    offset: 0,
                });
            }
            if let Value::Array(et, items) = value {
                if *et == ValueType::Array {
                    return Err(GgufError::NestedArray {
                        key: key.clone(),
                        offset: 0,
                    });
                }
                for (index, item) in items.iter().enumerate() {
                    if item.value_type() != *et {
                        return Err(GgufError::ArrayTypeMismatch {
                            key: key.clone(),
                            index,
                            expected: *et,
                            found: item.value_type(),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// The header, metadata, tensor infos and padding: everything before the first tensor's
    /// data.
    fn head(&self) -> Result<Vec<u8>> {
        self.validate_metadata()?;
        let alignment = self.alignment()?;
        let mut head = Vec::new();
        head.extend_from_slice(&GGUF_MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut head, key);
            head.extend_from_slice(&value.value_type().id().to_le_bytes());
            put_value(&mut head, value);
        }
        let mut offset = 0usize;
        for t in &self.tensors {
            put_str(&mut head, &t.name);
            head.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for &n in &t.ne {
                head.extend_from_slice(&(n as u64).to_le_bytes());
            }
            head.extend_from_slice(&t.dtype.id().to_le_bytes());
            head.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = t
                .size
                .checked_next_multiple_of(alignment)
                .and_then(|n| offset.checked_add(n))
                .ok_or_else(|| GgufError::SizeOverflow {
                    tensor: t.name.clone(),
                    dtype: t.dtype,
                    ne: t.ne.iter().map(|&n| n as u64).collect(),
                    what: "data section offset",
                })?;
        }
        head.resize(head.len().next_multiple_of(alignment), 0);
        Ok(head)
    }

    /// Writes the file to `w` (which is not buffered here: pass a `BufWriter` for a file).
    /// Everything is validated before the first byte is written. Every tensor must have its
    /// data (tensors only declared are written through [`stream_to_file`](Self::stream_to_file)).
    pub fn write_to<W: Write>(&self, mut w: W) -> Result<()> {
        if let Some(t) = self.tensors.iter().find(|t| t.data.is_none()) {
            return Err(GgufError::StreamOrder(format!(
                "tensor {:?} was declared without data: write the file with stream_to_file",
                t.name
            )));
        }
        let alignment = self.alignment()?;
        w.write_all(&self.head()?)?;
        for t in &self.tensors {
            let data = t.data.as_deref().expect("checked above");
            w.write_all(data)?;
            write_zeros(&mut w, data.len().next_multiple_of(alignment) - data.len())?;
        }
        w.flush()?;
        Ok(())
    }

    /// Creates `path` and writes everything up to the tensor data, plus the data of the leading
    /// tensors that have theirs; the data of the declared tensors then follows through
    /// [`GgufStreamWriter::write_tensor`], in declaration order, and
    /// [`GgufStreamWriter::finish`] completes the file. A stream dropped before `finish` (an
    /// error half-way) removes the partly written file.
    pub fn stream_to_file(self, path: impl AsRef<Path>) -> Result<GgufStreamWriter> {
        let head = self.head()?;
        let alignment = self.alignment()?;
        if let Some(i) = self.tensors.iter().position(|t| t.data.is_none()) {
            if let Some(t) = self.tensors[i..].iter().find(|t| t.data.is_some()) {
                return Err(GgufError::StreamOrder(format!(
                    "tensor {:?} has its data but comes after a declared tensor: add tensors with data first",
                    t.name
                )));
            }
        }
        let path = path.as_ref().to_path_buf();
        let file = File::create(&path)?;
        let mut s = GgufStreamWriter {
            out: Some(BufWriter::new(file)),
            path,
            alignment,
            pending: Vec::new(),
            next: 0,
        };
        s.put(&head)?;
        for t in self.tensors {
            match t.data {
                Some(d) => s.put_padded(&d)?,
                None => s.pending.push((t.name, t.size)),
            }
        }
        Ok(s)
    }
    /// The file as bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.write_to(&mut v)?;
        Ok(v)
    }

    /// Writes the file to `path` (created or truncated). On error, a partly written file is
    /// removed.
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        // Validate first, so that a bad writer does not clobber an existing file.
        self.validate_metadata()?;
        self.alignment()?;
        let path = path.as_ref();
        let file = File::create(path)?;
        let result = self
            .write_to(BufWriter::new(&file))
            .and_then(|()| Ok(file.sync_all()?));
        if result.is_err() {
            let _ = std::fs::remove_file(path);
        }
        result
    }
}

fn write_zeros<W: Write>(w: &mut W, mut n: usize) -> std::io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while n > 0 {
        let k = n.min(ZEROS.len());
        w.write_all(&ZEROS[..k])?;
        n -= k;
    }
    Ok(())
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn put_value(buf: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => buf.push(u8::from(*x)),
        Value::String(s) => put_str(buf, s),
        Value::Array(et, items) => {
            buf.extend_from_slice(&et.id().to_le_bytes());
            buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(buf, item);
            }
        }
        Value::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
    }
}

/// The second half of a streamed GGUF file (see [`GgufWriter::stream_to_file`]): the data of
/// the declared tensors, one at a time, in declaration order.
pub struct GgufStreamWriter {
    out: Option<BufWriter<File>>,
    path: std::path::PathBuf,
    alignment: usize,
    /// Declared tensors (name, size) still to write, from `next` on.
    pending: Vec<(String, usize)>,
    next: usize,
}

impl GgufStreamWriter {
    fn put(&mut self, b: &[u8]) -> Result<()> {
        self.out.as_mut().expect("open until finish").write_all(b)?;
        Ok(())
    }

    fn put_padded(&mut self, b: &[u8]) -> Result<()> {
        self.put(b)?;
        let pad = b.len().next_multiple_of(self.alignment) - b.len();
        write_zeros(self.out.as_mut().expect("open until finish"), pad)?;
        Ok(())
    }

    /// The name of the next tensor to write, if any.
    pub fn next_tensor(&self) -> Option<&str> {
        self.pending.get(self.next).map(|(n, _)| n.as_str())
    }

    /// Writes the data of tensor `name`, which must be the next declared one, with exactly its
    /// declared size.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<()> {
        let Some((want, size)) = self.pending.get(self.next).cloned() else {
            return Err(GgufError::StreamOrder(format!(
                "tensor {name:?} written after all declared tensors"
            )));
        };
        if want != name {
            return Err(GgufError::StreamOrder(format!(
                "tensor {name:?} written where {want:?} was declared next"
            )));
        }
        if data.len() != size {
            return Err(GgufError::StreamOrder(format!(
                "tensor {name:?} has {} bytes, {size} were declared",
                data.len()
            )));
        }
        self.put_padded(data)?;
        self.next += 1;
        Ok(())
    }

    /// Completes the file (every declared tensor must have been written) and syncs it.
    pub fn finish(mut self) -> Result<()> {
        if let Some(name) = self.next_tensor() {
            return Err(GgufError::StreamOrder(format!(
                "finish before tensor {name:?} (and {} more) was written",
                self.pending.len() - self.next - 1
            )));
        }
        let out = self.out.take().expect("open until finish");
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(())
    }
}

impl Drop for GgufStreamWriter {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            // not finished: the file is incomplete
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
