//! Datasets of (input, label) samples, like ggml-opt's: inputs are i32 (token ids) or f32
//! values, labels are class ids (one-hot rows of `n_classes` made on the fly) or dense f32 rows.
//! A dataset is split once into training and validation samples; the training order is a
//! permutation drawn from `(seed, epoch)`, so a run can be resumed anywhere.

use crate::TrainError;

/// What a sample's input is.
#[derive(Clone, Debug)]
pub enum Inputs {
    I32(Vec<i32>),
    F32(Vec<f32>),
}

/// A class id meaning "no label here": its row is all zeros, so it adds nothing to the loss
/// (prompt tokens when training on a chat's assistant replies only).
pub const NO_LABEL: u32 = u32::MAX;

/// What a sample's label is.
#[derive(Clone, Debug)]
pub enum Labels {
    /// `rows_per_sample` class ids per sample, each made a one-hot row of `n_classes`.
    Classes { ids: Vec<u32>, n_classes: usize },
    /// `ne_label` f32 values per sample (rows of probabilities for cross-entropy).
    Dense(Vec<f32>),
}

#[derive(Clone, Debug)]
pub struct Dataset {
    pub inputs: Inputs,
    /// Input values per sample.
    pub ne_input: usize,
    pub labels: Labels,
    /// Label rows per sample (one per predicted position).
    pub label_rows: usize,
    n: usize,
}

impl Dataset {
    /// A dataset of `n` samples; the arrays must hold exactly `n` samples' worth of values.
    pub fn new(
        inputs: Inputs,
        ne_input: usize,
        labels: Labels,
        label_rows: usize,
    ) -> Result<Dataset, TrainError> {
        let n_in = match &inputs {
            Inputs::I32(v) => v.len(),
            Inputs::F32(v) => v.len(),
        };
        if ne_input == 0 || label_rows == 0 || n_in % ne_input != 0 {
            return Err(TrainError::Data(format!(
                "{n_in} input values are not whole samples of {ne_input}"
            )));
        }
        let n = n_in / ne_input;
        let n_lab = match &labels {
            Labels::Classes { ids, n_classes } => {
                if let Some(&bad) = ids
                    .iter()
                    .find(|&&c| c != NO_LABEL && c as usize >= *n_classes)
                {
                    return Err(TrainError::Data(format!(
                        "label {bad} is out of range for {n_classes} classes"
                    )));
                }
                ids.len() / label_rows
            }
            Labels::Dense(v) => v.len() / label_rows,
        };
        if n_lab != n {
            return Err(TrainError::Data(format!(
                "{n} input samples but {n_lab} label samples"
            )));
        }
        Ok(Dataset {
            inputs,
            ne_input,
            labels,
            label_rows,
            n,
        })
    }

    /// Next-token samples from a token stream: sample `i` is `ctx` tokens starting at `i·ctx`
    /// and its labels are the `ctx` tokens that follow each of them.
    pub fn next_token(tokens: &[u32], ctx: usize, n_vocab: usize) -> Result<Dataset, TrainError> {
        Dataset::next_token_targets(tokens, tokens, ctx, n_vocab)
    }

    /// Like [`next_token`](Dataset::next_token), with the label of position `i` taken from
    /// `targets[i + 1]` (the token itself, or [`NO_LABEL`] where nothing is to be learned, such
    /// as the prompt of a chat). `targets` has one entry per token.
    pub fn next_token_targets(
        tokens: &[u32],
        targets: &[u32],
        ctx: usize,
        n_vocab: usize,
    ) -> Result<Dataset, TrainError> {
        if ctx == 0 || tokens.len() < ctx + 1 {
            return Err(TrainError::Data(format!(
                "{} tokens are too few for one sample of context {ctx}",
                tokens.len()
            )));
        }
        if targets.len() != tokens.len() {
            return Err(TrainError::Data(format!(
                "{} targets for {} tokens",
                targets.len(),
                tokens.len()
            )));
        }
        let n = (tokens.len() - 1) / ctx;
        let mut inp = Vec::with_capacity(n * ctx);
        let mut lab = Vec::with_capacity(n * ctx);
        for i in 0..n {
            inp.extend(tokens[i * ctx..(i + 1) * ctx].iter().map(|&t| t as i32));
            lab.extend_from_slice(&targets[i * ctx + 1..(i + 1) * ctx + 1]);
        }
        Dataset::new(
            Inputs::I32(inp),
            ctx,
            Labels::Classes {
                ids: lab,
                n_classes: n_vocab,
            },
            ctx,
        )
    }

    /// Where a run writing its model to `out` keeps its optimizer state: `OUT.train.gguf`.
    pub fn state_path(out: &std::path::Path) -> std::path::PathBuf {
        let mut s = out.as_os_str().to_owned();
        s.push(".train.gguf");
        std::path::PathBuf::from(s)
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Width of one label row.
    pub fn label_width(&self) -> usize {
        match &self.labels {
            Labels::Classes { n_classes, .. } => *n_classes,
            Labels::Dense(v) => v.len() / self.n / self.label_rows,
        }
    }

    /// Appends sample `i`'s input to `dst`.
    pub fn input_i32(&self, i: usize, dst: &mut Vec<i32>) {
        if let Inputs::I32(v) = &self.inputs {
            dst.extend_from_slice(&v[i * self.ne_input..(i + 1) * self.ne_input]);
        }
    }

    pub fn input_f32(&self, i: usize, dst: &mut Vec<f32>) {
        if let Inputs::F32(v) = &self.inputs {
            dst.extend_from_slice(&v[i * self.ne_input..(i + 1) * self.ne_input]);
        }
    }

    /// Appends sample `i`'s label rows (one-hot for class labels) to `dst`.
    pub fn label(&self, i: usize, dst: &mut Vec<f32>) {
        match &self.labels {
            Labels::Classes { ids, n_classes } => {
                for &c in &ids[i * self.label_rows..(i + 1) * self.label_rows] {
                    let start = dst.len();
                    dst.resize(start + n_classes, 0.0);
                    if c != NO_LABEL {
                        dst[start + c as usize] = 1.0;
                    }
                }
            }
            Labels::Dense(v) => {
                let w = v.len() / self.n;
                dst.extend_from_slice(&v[i * w..(i + 1) * w]);
            }
        }
    }
}

/// Indices of the training and validation samples: the last `val_frac` of the samples
/// (in order) are held out.
pub fn split(n: usize, val_frac: f32) -> (Vec<usize>, Vec<usize>) {
    let n_val = ((n as f64) * val_frac.clamp(0.0, 0.9) as f64).round() as usize;
    let n_val = if val_frac > 0.0 {
        n_val.max(1).min(n.saturating_sub(1))
    } else {
        0
    };
    ((0..n - n_val).collect(), (n - n_val..n).collect())
}

/// A permutation of `idx` determined by `(seed, epoch)` (Fisher–Yates with xorshift64*).
pub fn shuffled(idx: &[usize], seed: u64, epoch: u64) -> Vec<usize> {
    let mut v = idx.to_vec();
    let mut s =
        (seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    let mut next = || {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        s.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    for i in (1..v.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_token_samples_and_one_hot_labels() {
        let toks: Vec<u32> = (0..10).collect();
        let d = Dataset::next_token(&toks, 3, 10).unwrap();
        assert_eq!(d.len(), 3);
        let mut i = Vec::new();
        d.input_i32(1, &mut i);
        assert_eq!(i, vec![3, 4, 5]);
        let mut l = Vec::new();
        d.label(1, &mut l);
        assert_eq!(l.len(), 30);
        assert_eq!(l[4], 1.0); // next of 3 is 4
        assert_eq!(l[10 + 5], 1.0);
        assert_eq!(l[20 + 6], 1.0);
        assert_eq!(l.iter().sum::<f32>(), 3.0);
        assert!(Dataset::next_token(&toks[..3], 3, 10).is_err());
    }

    #[test]
    fn bad_datasets_are_refused() {
        let e = Dataset::new(Inputs::F32(vec![0.0; 7]), 2, Labels::Dense(vec![0.0; 4]), 1);
        assert!(e.unwrap_err().to_string().contains("not whole samples"));
        let e = Dataset::new(
            Inputs::I32(vec![0; 4]),
            2,
            Labels::Classes {
                ids: vec![0, 5],
                n_classes: 3,
            },
            1,
        );
        assert!(e.unwrap_err().to_string().contains("out of range"));
    }

    #[test]
    fn split_and_shuffle_are_deterministic() {
        let (t, v) = split(10, 0.2);
        assert_eq!(t, (0..8).collect::<Vec<_>>());
        assert_eq!(v, vec![8, 9]);
        let a = shuffled(&t, 42, 0);
        assert_eq!(a, shuffled(&t, 42, 0));
        assert_ne!(a, shuffled(&t, 42, 1));
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, t);
    }
}
