//! The strict reader.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use memmap2::Mmap;
use tessera::DType;

use crate::{GgufError, Value, ValueType, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_TENSOR_NAME_LEN};

type Result<T> = std::result::Result<T, GgufError>;

/// Where a tensor's data is, and what it is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorInfo {
    /// The tensor's name (unique in the file).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Number of dimensions written in the file (1..=4).
    pub n_dims: usize,
    /// Elements along each dimension, innermost first (ggml's `ne`); unused dimensions are 1.
    pub ne: [usize; 4],
    /// Byte offset of the data from the start of the data section (`GgufFile::data_offset`).
    pub offset: usize,
    /// Size of the data in bytes.
    pub size: usize,
}

impl TensorInfo {
    /// The dimensions written in the file: `&ne[..n_dims]`.
    pub fn shape(&self) -> &[usize] {
        &self.ne[..self.n_dims]
    }

    /// Total number of elements.
    pub fn n_elements(&self) -> usize {
        self.ne.iter().product()
    }

    /// Number of rows (`ne[1] * ne[2] * ne[3]`).
    pub fn n_rows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }
}

enum Storage {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A validated GGUF file: its metadata, its tensor table, and (zero-copy) its bytes.
///
/// Opening checks everything that can be checked without interpreting tensor data, so once a
/// `GgufFile` exists every tensor's bytes lie inside the file, aligned, and no two overlap.
pub struct GgufFile {
    /// Format version (2 or 3; both have the same layout).
    pub version: u32,
    /// Alignment of tensor data: `general.alignment`, or 32 when absent.
    pub alignment: usize,
    /// Metadata key/value pairs in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    /// Byte offset of the data section from the start of the file.
    pub data_offset: usize,
    storage: Storage,
    kv_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .field("len", &self.bytes().len())
            .field("mmap", &matches!(self.storage, Storage::Mmap(_)))
            .finish()
    }
}

impl GgufFile {
    /// Opens and validates the file at `path`, memory-mapping it (read-only, zero-copy).
    ///
    /// The file must not be modified while the `GgufFile` is alive (see `memmap2::Mmap::map`).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let mut file = File::open(path.as_ref())?;
        let len = file.metadata()?.len();
        if len == 0 {
            // Mapping an empty file fails on some platforms; an empty buffer gives the right error.
            let mut v = Vec::new();
            file.read_to_end(&mut v)?;
            return Self::from_bytes(v);
        }
        // SAFETY: the map is read-only and we never hand out `&mut` to it. Memory-mapped files are
        // sound only as long as no one else truncates or writes the file while it is mapped; that
        // is the documented contract of `GgufFile::open`, as for every mmap-based model loader.
        let map = unsafe { Mmap::map(&file)? };
        Self::from_storage(Storage::Mmap(map))
    }

    /// Validates a GGUF file held in memory (same checks as `open`).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::from_storage(Storage::Owned(bytes))
    }

    fn from_storage(storage: Storage) -> Result<Self> {
        let p = parse(storage.bytes())?;
        Ok(GgufFile {
            version: p.version,
            alignment: p.alignment,
            metadata: p.metadata,
            tensors: p.tensors,
            data_offset: p.data_offset,
            storage,
            kv_index: p.kv_index,
            tensor_index: p.tensor_index,
        })
    }

    /// The value of metadata key `key` (hash lookup).
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self.kv_index.get(key).and_then(|&i| self.metadata.get(i)) {
            Some((k, v)) if k == key => Some(v),
            // `metadata` is public: if someone reordered it, fall back to a scan.
            _ => self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v),
        }
    }

    /// The tensor named `name` (hash lookup).
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        match self
            .tensor_index
            .get(name)
            .and_then(|&i| self.tensors.get(i))
        {
            Some(t) if t.name == name => Some(t),
            _ => self.tensors.iter().find(|t| t.name == name),
        }
    }

    /// The bytes of tensor `t` (a slice of the map, no copy).
    ///
    /// # Panics
    /// If `t` does not lie within this file, which cannot happen for a `TensorInfo` taken from
    /// this file's `tensors` (they were all checked when it was opened).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let range = self
            .data_offset
            .checked_add(t.offset)
            .and_then(|start| Some(start..start.checked_add(t.size)?));
        range.and_then(|r| self.bytes().get(r)).unwrap_or_else(|| {
            panic!(
                "tensor {:?} (offset {}, {} bytes) is not inside this file",
                t.name, t.offset, t.size
            )
        })
    }

    /// The bytes of the tensor named `name`, if there is one.
    pub fn tensor_data_by_name(&self, name: &str) -> Option<&[u8]> {
        self.tensor(name).map(|t| self.tensor_data(t))
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Whether the file is memory-mapped (`open`) rather than held in an owned buffer.
    pub fn is_mmapped(&self) -> bool {
        matches!(self.storage, Storage::Mmap(_))
    }

    /// Tells the system that this process will not read bytes `offset..offset + len` of the
    /// file soon (e.g. a tensor copied into another layout): on Linux their mapped pages leave
    /// its resident set (`MADV_DONTNEED`, the pages rounded outwards); reading them later
    /// faults the same bytes back in from the file. Does nothing for an owned buffer or
    /// elsewhere; the range must lie inside the file.
    pub fn release(&self, offset: usize, len: usize) -> std::io::Result<()> {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.bytes().len())
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "release: bytes {offset}..{offset}+{len} run past the file's {}",
                    self.bytes().len()
                ),
            ));
        }
        #[cfg(target_os = "linux")]
        if let Storage::Mmap(m) = &self.storage {
            // SAFETY: the map is read-only and of a file that must not change while it is
            // mapped (`open`'s contract), so after MADV_DONTNEED any read through a live
            // borrow faults in the same bytes from the file: no value anyone holds changes.
            unsafe {
                m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len)?;
            }
        }
        Ok(())
    }
}

struct Parsed {
    version: u32,
    alignment: usize,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
    data_offset: usize,
    kv_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

/// A bounds-checked little-endian reader over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let available = self.remaining() as u64;
        if n > available {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.offset(),
                needed: n,
                available,
            });
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn fixed<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N as u64, what)?);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.fixed(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.fixed(what)?))
    }

    /// A GGUF string: u64 length, then that many bytes of UTF-8.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(&|| format!("length of {}", what()))?;
        let start = self.offset();
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset: start,
                valid_up_to: e.valid_up_to(),
            }),
        }
    }

    /// One value of scalar or string type `t` (not an array).
    fn scalar(&mut self, t: ValueType, key: &str) -> Result<Value> {
        let what = || format!("value of key {key:?}");
        Ok(match t {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.fixed(&what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.fixed(&what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.fixed(&what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.fixed(&what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.fixed(&what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.fixed(&what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.fixed(&what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.fixed(&what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.fixed(&what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.fixed(&what)?)),
            ValueType::Bool => {
                let offset = self.offset();
                match self.fixed::<1>(&what)?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    value => {
                        return Err(GgufError::InvalidBool {
                            key: key.to_string(),
                            value,
                            offset,
                        })
                    }
                }
            }
            ValueType::String => Value::String(self.string(&what)?),
            ValueType::Array => {
                return Err(GgufError::NestedArray {
                    key: key.to_string(),
                    offset: self.offset(),
                })
            }
        })
    }

    /// A value type id, checked.
    fn value_type(&mut self, key: &str, what: &dyn Fn() -> String) -> Result<ValueType> {
        let offset = self.offset();
        let id = self.u32(what)?;
        ValueType::from_id(id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_string(),
            id,
            offset,
        })
    }

    /// A value of type `t` (arrays included).
    fn value(&mut self, t: ValueType, key: &str) -> Result<Value> {
        if t != ValueType::Array {
            return self.scalar(t, key);
        }
        let elem_offset = self.offset();
        let et = self.value_type(key, &|| format!("array element type of key {key:?}"))?;
        if et == ValueType::Array {
            return Err(GgufError::NestedArray {
                key: key.to_string(),
                offset: elem_offset,
            });
        }
        let count = self.u64(&|| format!("array length of key {key:?}"))?;
        // Check the count against what remains before allocating anything sized by it.
        let needed = count.saturating_mul(et.min_size() as u64);
        let available = self.remaining() as u64;
        if needed > available {
            return Err(GgufError::Truncated {
                what: format!("array of {count} {et} of key {key:?}"),
                offset: self.offset(),
                needed,
                available,
            });
        }
        let mut items = Vec::with_capacity(count as usize);
        for _ in 0..count {
            items.push(self.scalar(et, key)?);
        }
        Ok(Value::Array(et, items))
    }
}

/// Smallest on-disk metadata entry: key length, a 1-byte key, type id, a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Smallest on-disk tensor info: name length (empty name), n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

fn parse(buf: &[u8]) -> Result<Parsed> {
    let mut c = Cursor { buf, pos: 0 };

    let magic: [u8; 4] = c.fixed(&|| "magic".to_string())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32(&|| "version".to_string())?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors_offset = c.offset();
    let n_tensors = c.u64(&|| "tensor count".to_string())?;
    let n_kv_offset = c.offset();
    let n_kv = c.u64(&|| "metadata count".to_string())?;

    // Both counts must fit in what remains, each entry at its smallest.
    let remaining = c.remaining() as u64;
    let max_kv = remaining / MIN_KV_BYTES;
    if n_kv > max_kv {
        return Err(GgufError::CountTooLarge {
            what: "metadata count",
            count: n_kv,
            max: max_kv,
            remaining,
            offset: n_kv_offset,
        });
    }
    let max_tensors = (remaining - n_kv * MIN_KV_BYTES) / MIN_TENSOR_INFO_BYTES;
    if n_tensors > max_tensors {
        return Err(GgufError::CountTooLarge {
            what: "tensor count",
            count: n_tensors,
            max: max_tensors,
            remaining,
            offset: n_tensors_offset,
        });
    }

    // Metadata.
    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut kv_index = HashMap::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key_offset = c.offset();
        let key = c.string(&|| format!("metadata key #{i}"))?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey {
                index: i,
                offset: key_offset,
            });
        }
        if kv_index.contains_key(&key) {
            return Err(GgufError::DuplicateKey {
                key,
                offset: key_offset,
            });
        }
        let t = c.value_type(&key, &|| format!("value type of key {key:?}"))?;
        let v = c.value(t, &key)?;
        kv_index.insert(key.clone(), metadata.len());
        metadata.push((key, v));
    }

    let alignment = match kv_index.get(crate::KEY_ALIGNMENT).map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) => {
            let a = *a;
            if a == 0 || !a.is_power_of_two() {
                return Err(GgufError::BadAlignment(a.into()));
            }
            a as usize
        }
        Some(v) => {
            return Err(GgufError::AlignmentType {
                found: v.value_type(),
            })
        }
    };

    // Tensor infos.
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors as usize);
    let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name = c.string(&|| format!("name of tensor #{i}"))?;
        if name.len() > MAX_TENSOR_NAME_LEN {
            return Err(GgufError::NameTooLong {
                len: name.len(),
                tensor: name,
                max: MAX_TENSOR_NAME_LEN,
            });
        }
        if tensor_index.contains_key(&name) {
            return Err(GgufError::DuplicateTensor(name));
        }
        let n_dims = c.u32(&|| format!("n_dims of tensor {name:?}"))?;
        if n_dims == 0 {
            return Err(GgufError::NoDims { tensor: name });
        }
        if n_dims > 4 {
            return Err(GgufError::TooManyDims {
                tensor: name,
                n_dims: n_dims.into(),
            });
        }
        let mut ne = [1u64; 4];
        for (d, n) in ne.iter_mut().enumerate().take(n_dims as usize) {
            *n = c.u64(&|| format!("ne[{d}] of tensor {name:?}"))?;
            if *n > i64::MAX as u64 {
                return Err(GgufError::NegativeDim {
                    tensor: name,
                    dim: d,
                    value: *n as i64,
                });
            }
        }
        let type_id = c.u32(&|| format!("type of tensor {name:?}"))?;
        let Some(dtype) = DType::from_id(type_id) else {
            return Err(GgufError::UnknownTensorType {
                tensor: name,
                id: type_id,
            });
        };
        let offset = c.u64(&|| format!("data offset of tensor {name:?}"))?;

        let overflow = |name: String, what| GgufError::SizeOverflow {
            tensor: name,
            dtype,
            ne: ne.to_vec(),
            what,
        };
        let n_elements = ne
            .iter()
            .try_fold(1u64, |acc, &n| acc.checked_mul(n))
            .filter(|&n| n <= i64::MAX as u64);
        if n_elements.is_none() {
            return Err(overflow(name, "element count"));
        }
        let block = dtype.block_size() as u64;
        if ne[0] % block != 0 {
            return Err(GgufError::RowNotBlockMultiple {
                tensor: name,
                dtype,
                ne0: ne[0],
                block: dtype.block_size(),
            });
        }
        let size = ne[1..]
            .iter()
            .try_fold(
                (ne[0] / block).checked_mul(dtype.type_size() as u64),
                |acc, &n| Some(acc?.checked_mul(n)),
            )
            .flatten()
            .and_then(|s| usize::try_from(s).ok());
        let Some(size) = size else {
            return Err(overflow(name, "byte size"));
        };
        let mut ne_usize = [1usize; 4];
        for (dst, &src) in ne_usize.iter_mut().zip(&ne) {
            let Ok(v) = usize::try_from(src) else {
                return Err(overflow(name, "dimension"));
            };
            *dst = v;
        }
        if offset % alignment as u64 != 0 {
            return Err(GgufError::Misaligned {
                tensor: name,
                offset,
                alignment,
            });
        }
        // Bounds are checked once the data section's start is known; keep the raw offset for now
        // (usize::MAX stands for "does not fit", which the bounds check rejects).
        let offset = usize::try_from(offset).unwrap_or(usize::MAX);

        tensor_index.insert(name.clone(), tensors.len());
        tensors.push(TensorInfo {
            name,
            dtype,
            n_dims: n_dims as usize,
            ne: ne_usize,
            offset,
            size,
        });
    }

    // The data section starts at the next multiple of the alignment (ggml: only when there are
    // tensors; a file without tensors may end right after its metadata).
    let end_of_infos = c.pos;
    let data_offset = if n_tensors > 0 {
        let aligned = end_of_infos
            .checked_next_multiple_of(alignment)
            .unwrap_or(usize::MAX);
        if aligned > buf.len() {
            return Err(GgufError::Truncated {
                what: format!("padding before the data section (alignment {alignment})"),
                offset: end_of_infos as u64,
                needed: (aligned - end_of_infos) as u64,
                available: (buf.len() - end_of_infos) as u64,
            });
        }
        aligned
    } else {
        end_of_infos
    };
    let data_len = buf.len() - data_offset;

    for t in &tensors {
        let in_bounds = t
            .offset
            .checked_add(t.size)
            .is_some_and(|end| end <= data_len);
        if !in_bounds {
            return Err(GgufError::DataOutOfBounds {
                tensor: t.name.clone(),
                offset: t.offset as u64,
                size: t.size as u64,
                data_len: data_len as u64,
            });
        }
    }

    // No two tensors may share bytes. Sorted by start, an overlap anywhere implies an overlap
    // between neighbours. Empty tensors occupy no bytes.
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors[i].size > 0)
        .collect();
    order.sort_by_key(|&i| (tensors[i].offset, i));
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if a.offset + a.size > b.offset {
            let range = |t: &TensorInfo| t.offset as u64..(t.offset + t.size) as u64;
            return Err(GgufError::Overlap {
                a: a.name.clone(),
                a_range: range(a),
                b: b.name.clone(),
                b_range: range(b),
            });
        }
    }

    Ok(Parsed {
        version,
        alignment,
        metadata,
        tensors,
        data_offset,
        kv_index,
        tensor_index,
    })
}
