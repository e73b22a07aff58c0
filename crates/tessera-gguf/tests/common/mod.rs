//! Helpers shared by the integration tests: a raw GGUF byte builder (for files the writer
//! refuses to make) and a small deterministic RNG.

#![allow(dead_code)]

/// Builds GGUF bytes field by field, with no validation at all.
#[derive(Default, Clone)]
pub struct Raw {
    pub b: Vec<u8>,
}

impl Raw {
    /// Magic, version, tensor count, metadata count.
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw::default();
        r.b.extend_from_slice(b"GGUF");
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.b.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.b.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.b.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.b.extend_from_slice(v);
        self
    }
    /// A GGUF string from raw bytes (need not be UTF-8).
    pub fn str_bytes(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).bytes(s)
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.str_bytes(s.as_bytes())
    }
    /// A u32 metadata entry.
    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key).u32(4).u32(v)
    }
    /// A tensor info.
    pub fn tensor(&mut self, name: &str, ne: &[u64], type_id: u32, offset: u64) -> &mut Self {
        self.str(name).u32(ne.len() as u32);
        for &n in ne {
            self.u64(n);
        }
        self.u32(type_id).u64(offset)
    }
    /// Zero padding up to a multiple of `align`.
    pub fn pad(&mut self, align: usize) -> &mut Self {
        let n = self.b.len().next_multiple_of(align);
        self.b.resize(n, 0);
        self
    }
    /// `n` bytes of tensor data.
    pub fn data(&mut self, n: usize) -> &mut Self {
        self.b.extend((0..n).map(|i| i as u8));
        self
    }
    pub fn done(&self) -> Vec<u8> {
        self.b.clone()
    }
}

/// xorshift64: a fixed-seed generator, good enough to pick bytes to flip.
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform-ish in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
