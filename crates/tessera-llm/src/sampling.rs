//! Token sampling: greedy, temperature, top-k, top-p, min-p, repetition / frequency / presence
//! penalties, seeded. The chain follows llama.cpp's default order: penalties, top-k, top-p,
//! min-p, temperature, then a draw (or the arg-max when the temperature is 0).

#[derive(Clone, Debug)]
pub struct SamplerParams {
    /// 0 or less: greedy.
    pub temp: f32,
    /// 0: disabled.
    pub top_k: usize,
    /// 1.0: disabled.
    pub top_p: f32,
    /// 0.0: disabled.
    pub min_p: f32,
    /// 1.0: disabled.
    pub repeat_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerParams {
    /// llama.cpp's defaults.
    fn default() -> Self {
        SamplerParams {
            temp: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0x5EED,
        }
    }
}

impl SamplerParams {
    /// Checks ranges, naming the first bad parameter.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.top_p) || self.top_p.is_nan() {
            return Err(format!("top_p must be in [0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) || self.min_p.is_nan() {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if self.temp.is_nan() || self.temp < 0.0 {
            return Err(format!("temperature must be >= 0, got {}", self.temp));
        }
        if self.repeat_penalty.is_nan() || self.repeat_penalty <= 0.0 {
            return Err(format!(
                "repeat_penalty must be > 0, got {}",
                self.repeat_penalty
            ));
        }
        Ok(())
    }
}

pub struct Sampler {
    pub params: SamplerParams,
    rng: u64,
    history: Vec<u32>,
    cand: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Sampler {
        let rng = params.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        Sampler {
            params,
            rng: rng | 1,
            history: Vec::new(),
            cand: Vec::new(),
        }
    }

    /// Records a token (prompt or generated) for the penalties.
    pub fn accept(&mut self, tok: u32) {
        self.history.push(tok);
    }

    fn next_f64(&mut self) -> f64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Picks the next token from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = self.params.clone();
        self.cand.clear();
        self.cand
            .extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        // penalties over the recent history
        if p.repeat_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            let recent = &self.history[self.history.len().saturating_sub(p.penalty_last_n)..];
            let mut counts: std::collections::HashMap<u32, usize> =
                std::collections::HashMap::new();
            for &t in recent {
                *counts.entry(t).or_default() += 1;
            }
            for (&t, &c) in &counts {
                if let Some(e) = self.cand.get_mut(t as usize) {
                    if e.1 <= 0.0 {
                        e.1 *= p.repeat_penalty;
                    } else {
                        e.1 /= p.repeat_penalty;
                    }
                    e.1 -= c as f32 * p.frequency_penalty + p.presence_penalty;
                }
            }
        }
        if p.temp <= 0.0 {
            // greedy: the first maximum, like llama.cpp's greedy sampler
            let mut best = 0;
            for (i, &(_, l)) in self.cand.iter().enumerate() {
                if l > self.cand[best].1 {
                    best = i;
                }
            }
            return self.cand[best].0;
        }
        self.cand
            .sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal));
        if p.top_k > 0 {
            self.cand.truncate(p.top_k.max(1));
        }
        // softmax over what is left
        let softmax = |c: &[(u32, f32)]| -> Vec<f64> {
            let max = c[0].1 as f64;
            let e: Vec<f64> = c.iter().map(|&(_, l)| ((l as f64) - max).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(|x| x / s).collect()
        };
        if p.top_p < 1.0 {
            let probs = softmax(&self.cand);
            let mut cum = 0.0;
            let mut keep = probs.len();
            for (i, pr) in probs.iter().enumerate() {
                cum += pr;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            self.cand.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            let probs = softmax(&self.cand);
            let thr = probs[0] * p.min_p as f64;
            let keep = probs.iter().take_while(|&&x| x >= thr).count();
            self.cand.truncate(keep.max(1));
        }
        for c in &mut self.cand {
            c.1 /= p.temp;
        }
        let probs = softmax(&self.cand);
        let r = self.next_f64();
        let mut cum = 0.0;
        for (i, pr) in probs.iter().enumerate() {
            cum += pr;
            if r < cum {
                return self.cand[i].0;
            }
        }
        self.cand.last().map_or(0, |c| c.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut s = Sampler::new(SamplerParams {
            temp: 0.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]), 1);
    }

    #[test]
    fn top_k_1_is_greedy_and_seeds_repeat() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 101) as f32 / 10.0).collect();
        let mut s = Sampler::new(SamplerParams {
            top_k: 1,
            ..Default::default()
        });
        let best = (0..100)
            .max_by(|&a, &b| logits[a].partial_cmp(&logits[b]).unwrap())
            .unwrap() as u32;
        assert_eq!(s.sample(&logits), best);
        let draw = |seed| {
            let mut s = Sampler::new(SamplerParams {
                seed,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                temp: 5.0,
                ..Default::default()
            });
            (0..20).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn min_p_and_top_p_cut_the_tail() {
        // probabilities ~ [0.5, 0.25, 0.125, ...]: min_p 0.3 keeps the first two only
        let logits: Vec<f32> = (0..10)
            .map(|i| -(i as f32) * std::f32::consts::LN_2)
            .collect();
        let mut s = Sampler::new(SamplerParams {
            min_p: 0.3,
            top_p: 1.0,
            top_k: 0,
            temp: 1.0,
            ..Default::default()
        });
        for _ in 0..200 {
            assert!(s.sample(&logits) < 2);
        }
        let mut s = Sampler::new(SamplerParams {
            min_p: 0.0,
            top_p: 0.7,
            top_k: 0,
            temp: 1.0,
            ..Default::default()
        });
        for _ in 0..200 {
            assert!(s.sample(&logits) < 2, "top_p 0.7 keeps 0.5 + 0.25");
        }
    }

    #[test]
    fn repetition_penalty_demotes_seen_tokens() {
        let mut s = Sampler::new(SamplerParams {
            temp: 0.0,
            repeat_penalty: 2.0,
            ..Default::default()
        });
        s.accept(0);
        assert_eq!(s.sample(&[2.0, 1.5]), 1);
        let bad = SamplerParams {
            top_p: 1.5,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("top_p"));
    }
}
