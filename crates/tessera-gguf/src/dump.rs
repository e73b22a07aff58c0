//! A human-readable listing of a file, like gguf-py's `gguf-dump`.

use std::fmt::Write;

use crate::GgufFile;

/// Lists `f`: a header line (version, number of key/value pairs, number of tensors, alignment,
/// data section offset), every metadata key with its type and value (strings quoted, long arrays
/// shortened to `[a, b, c, d, e, ... (N total)]`), then a table of tensors with index, name,
/// type, shape (`ne0 x ne1 ...`), size in bytes and offset from the data section start.
pub fn dump(f: &GgufFile) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "GGUF v{}: {} key/value pairs, {} tensors, alignment {}, data section at byte {} ({} bytes in all)",
        f.version,
        f.metadata.len(),
        f.tensors.len(),
        f.alignment,
        f.data_offset,
        f.bytes().len()
    );

    if !f.metadata.is_empty() {
        out.push_str("\nmetadata:\n");
        let idx_w = digits(f.metadata.len());
        let key_w = f
            .metadata
            .iter()
            .map(|(k, _)| k.chars().count())
            .max()
            .unwrap_or(0);
        let types: Vec<String> = f
            .metadata
            .iter()
            .map(|(_, v)| v.type_description())
            .collect();
        let type_w = types.iter().map(|t| t.len()).max().unwrap_or(0);
        for (i, ((key, value), ty)) in f.metadata.iter().zip(&types).enumerate() {
            let _ = writeln!(out, "  {i:>idx_w$}  {key:<key_w$}  {ty:<type_w$} = {value}");
        }
    }

    if !f.tensors.is_empty() {
        out.push_str("\ntensors:\n");
        let rows: Vec<[String; 6]> = f
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let shape: Vec<String> = t.shape().iter().map(|n| n.to_string()).collect();
                [
                    i.to_string(),
                    t.name.clone(),
                    t.dtype.name().to_string(),
                    shape.join(" x "),
                    t.size.to_string(),
                    t.offset.to_string(),
                ]
            })
            .collect();
        let header = ["#", "name", "type", "shape", "bytes", "offset"].map(String::from);
        let mut w = [0usize; 6];
        for r in std::iter::once(&header).chain(&rows) {
            for (wi, cell) in w.iter_mut().zip(r) {
                *wi = (*wi).max(cell.chars().count());
            }
        }
        for r in std::iter::once(&header).chain(&rows) {
            let _ = writeln!(
                out,
                "  {:>w0$}  {:<w1$}  {:<w2$}  {:<w3$}  {:>w4$}  {:>w5$}",
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                r[5],
                w0 = w[0],
                w1 = w[1],
                w2 = w[2],
                w3 = w[3],
                w4 = w[4],
                w5 = w[5],
            );
        }
    }
    out
}

fn digits(n: usize) -> usize {
    n.saturating_sub(1).to_string().len()
}
