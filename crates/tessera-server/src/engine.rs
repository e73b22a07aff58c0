//! The scheduler: one thread owns the model's `BatchContext` with one sequence per slot. Each
//! step it admits queued requests into free slots (reusing the longest cached prompt prefix),
//! drops requests whose client went away, and decodes one batch holding the next token of every
//! generating slot plus prompt tokens of admitted ones (continuous batching).

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

use tessera_llm::batch::{BatchContext, SeqTokens};
use tessera_llm::{Model, Sampler};
use tokio::sync::mpsc::UnboundedSender;

use crate::api::{ApiError, GenParams};

/// One token's log-probability and its most likely alternatives (from the model's raw
/// distribution, before penalties and temperature).
#[derive(Clone, Debug)]
pub struct TokenLogprob {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<(String, Vec<u8>, f32)>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

#[derive(Debug)]
pub enum Event {
    /// New text (possibly empty when held back for a stop sequence) and the tokens that made it.
    Text {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Done {
        finish_reason: &'static str,
        usage: Usage,
    },
    Error(ApiError),
}

/// A request waiting for a slot.
pub struct Job {
    pub prompt: Vec<u32>,
    pub params: GenParams,
    pub events: UnboundedSender<Event>,
}

struct Active {
    job: Job,
    sampler: Sampler,
    /// Prompt tokens not yet evaluated.
    todo: Vec<u32>,
    /// The last sampled token, evaluated in the next step.
    next: Option<u32>,
    n_gen: usize,
    cached: usize,
    pending: Vec<u8>,
    text: String,
    sent: usize,
}

struct Slot {
    /// Tokens in this slot's cache rows.
    cache: Vec<u32>,
    active: Option<Active>,
    last_used: u64,
}

/// What `GET /slots` shows of a slot.
#[derive(Clone, Debug, Default)]
pub struct SlotInfo {
    pub processing: bool,
    /// Tokens held in the slot's cache.
    pub n_cached: usize,
    /// Requests this slot has finished or dropped.
    pub n_done: u64,
}

pub type SlotTable = Arc<std::sync::Mutex<Vec<SlotInfo>>>;

pub struct Engine {
    ctx: BatchContext,
    table: SlotTable,
    model: Arc<Model>,
    slots: Vec<Slot>,
    queue: VecDeque<Job>,
    tick: u64,
}

/// Length of the common prefix.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Engine {
    pub fn new(ctx: BatchContext, table: SlotTable) -> Engine {
        let model = Arc::clone(&ctx.model);
        let slots = (0..ctx.n_seq())
            .map(|_| Slot {
                cache: Vec::new(),
                active: None,
                last_used: 0,
            })
            .collect();
        if let Ok(mut t) = table.lock() {
            *t = vec![SlotInfo::default(); ctx.n_seq()];
        }
        Engine {
            ctx,
            table,
            model,
            slots,
            queue: VecDeque::new(),
            tick: 0,
        }
    }

    /// Runs until the job channel closes and no work is left.
    pub fn run(mut self, jobs: Receiver<Job>) {
        self.warm_up();
        let mut open = true;
        loop {
            let busy = !self.queue.is_empty() || self.slots.iter().any(|s| s.active.is_some());
            if !busy {
                if !open {
                    return;
                }
                match jobs.recv() {
                    Ok(j) => self.queue.push_back(j),
                    Err(_) => return,
                }
            }
            while open {
                match jobs.try_recv() {
                    Ok(j) => self.queue.push_back(j),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            self.step();
            self.publish();
        }
    }

    /// Plans the graph of decoding one token before the first request, so that it does not
    /// wait for it; the cache is left empty.
    fn warm_up(&mut self) {
        let tok = [self.model.tokenizer.bos().unwrap_or(0)];
        let entry = SeqTokens {
            seq: 0,
            tokens: &tok,
            logits: true,
        };
        let _ = self.ctx.eval(&[entry]);
        self.ctx.truncate(0, 0);
    }

    fn publish(&self) {
        if let Ok(mut t) = self.table.lock() {
            for (info, s) in t.iter_mut().zip(&self.slots) {
                let was = std::mem::replace(&mut info.processing, s.active.is_some());
                if was && !info.processing {
                    info.n_done += 1;
                }
                info.n_cached = s.cache.len();
            }
        }
    }

    /// Puts queued jobs into free slots: the free slot whose cache shares the longest prefix
    /// with the prompt (then the least recently used), keeping that prefix in the cache.
    fn admit(&mut self) {
        while let Some(job) = self.queue.pop_front() {
            if job.events.is_closed() {
                continue;
            }
            let best = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.active.is_none())
                .max_by_key(|(_, s)| (common_prefix(&s.cache, &job.prompt), u64::MAX - s.last_used))
                .map(|(i, _)| i);
            let Some(i) = best else {
                self.queue.push_front(job);
                return;
            };
            // at least the prompt's last token is evaluated again: its logits are needed
            let keep = common_prefix(&self.slots[i].cache, &job.prompt)
                .min(job.prompt.len().saturating_sub(1));
            self.ctx.truncate(i, keep);
            let slot = &mut self.slots[i];
            slot.cache.truncate(keep);
            let mut sampler = Sampler::new(job.params.sampler.clone());
            for &t in &job.prompt {
                sampler.accept(t);
            }
            slot.active = Some(Active {
                todo: job.prompt[keep..].to_vec(),
                job,
                sampler,
                next: None,
                n_gen: 0,
                cached: keep,
                pending: Vec::new(),
                text: String::new(),
                sent: 0,
            });
        }
    }

    fn step(&mut self) {
        self.tick += 1;
        for s in &mut self.slots {
            if s.active.as_ref().is_some_and(|a| a.job.events.is_closed()) {
                s.active = None; // the client went away
            }
        }
        self.admit();
        self.publish(); // admitted requests show as processing before their first token
        let budget = self.ctx.params.n_batch;
        // one token for every generating slot, then prompt tokens while the budget lasts
        let mut plan: Vec<(usize, Vec<u32>, bool)> = Vec::new();
        let mut used = 0;
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(t) = s.active.as_ref().and_then(|a| a.next) {
                plan.push((i, vec![t], true));
                used += 1;
            }
        }
        for (i, s) in self.slots.iter().enumerate() {
            let Some(a) = &s.active else { continue };
            if a.next.is_some() || a.todo.is_empty() || used >= budget {
                continue;
            }
            let n = a.todo.len().min(budget - used);
            plan.push((i, a.todo[..n].to_vec(), n == a.todo.len()));
            used += n;
        }
        if plan.is_empty() {
            return; // only when nothing is active: every active slot has a token or a prompt
        }
        let entries: Vec<SeqTokens> = plan
            .iter()
            .map(|(i, t, l)| SeqTokens {
                seq: *i,
                tokens: t,
                logits: *l,
            })
            .collect();
        let logits = match self.ctx.eval(&entries) {
            Ok(l) => l.to_vec(),
            Err(e) => {
                // nothing of this batch is trusted: its slots start over
                for (i, _, _) in &plan {
                    let s = &mut self.slots[*i];
                    if let Some(a) = s.active.take() {
                        let _ = a.job.events.send(Event::Error(ApiError::server(format!(
                            "decoding failed: {e}"
                        ))));
                    }
                    s.cache.clear();
                    self.ctx.truncate(*i, 0);
                }
                return;
            }
        };
        let nv = self.model.hp.n_vocab;
        let mut row = 0;
        for (i, toks, want) in plan {
            let tick = self.tick;
            let slot = &mut self.slots[i];
            slot.cache.extend_from_slice(&toks);
            slot.last_used = tick;
            let Some(a) = slot.active.as_mut() else {
                continue;
            };
            if a.next.take().is_none() {
                a.todo.drain(..toks.len());
            }
            if !want {
                continue;
            }
            let l = &logits[row * nv..(row + 1) * nv];
            row += 1;
            let n_past = self.ctx.n_past(i);
            let finished = sample_one(&self.model, a, l, n_past >= self.ctx.n_ctx());
            if let Some(reason) = finished {
                let a = slot.active.take().expect("active");
                let usage = Usage {
                    prompt_tokens: a.job.prompt.len(),
                    completion_tokens: a.n_gen,
                    cached_tokens: a.cached,
                };
                let _ = a.job.events.send(Event::Done {
                    finish_reason: reason,
                    usage,
                });
            }
        }
    }
}

/// Samples the next token of `a` from `logits`, sends the text it releases and returns the
/// finish reason when the request is done.
fn sample_one(
    model: &Model,
    a: &mut Active,
    logits: &[f32],
    context_full: bool,
) -> Option<&'static str> {
    let tk = &model.tokenizer;
    let tok = a.sampler.sample(logits);
    if tk.is_eog(tok) {
        flush(a, Vec::new());
        return Some("stop");
    }
    a.sampler.accept(tok);
    a.n_gen += 1;
    a.next = Some(tok);
    let bytes = tk.decode_token(tok);
    let lp = a
        .job
        .params
        .logprobs
        .map(|k| vec![logprob_of(model, logits, tok, &bytes, k)])
        .unwrap_or_default();
    a.pending.extend_from_slice(&bytes);
    let valid = match std::str::from_utf8(&a.pending) {
        Ok(_) => a.pending.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => a.pending.len(),
    };
    let piece = String::from_utf8_lossy(&a.pending[..valid]).into_owned();
    a.pending.drain(..valid);
    a.text.push_str(&piece);
    // a stop sequence ends the text just before it
    let stops = &a.job.params.stop;
    let longest = stops.iter().map(String::len).max().unwrap_or(0);
    let mut from = a.sent.saturating_sub(longest);
    while !a.text.is_char_boundary(from) {
        from -= 1;
    }
    let hit = stops
        .iter()
        .filter_map(|s| a.text[from..].find(s.as_str()))
        .min();
    if let Some(at) = hit {
        a.text.truncate(from + at);
        a.pending.clear();
        flush(a, lp);
        return Some("stop");
    }
    if a.n_gen >= a.job.params.max_tokens || context_full {
        flush(a, lp);
        return Some("length");
    }
    // hold back a tail that may be the start of a stop sequence
    let hold = stops
        .iter()
        .map(|s| {
            (1..s.len())
                .rev()
                .find(|&k| s.is_char_boundary(k) && a.text.ends_with(&s[..k]))
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0);
    let end = (a.text.len() - hold).max(a.sent);
    let text = a.text[a.sent..end].to_string();
    a.sent = end;
    let _ = a.job.events.send(Event::Text { text, logprobs: lp });
    None
}

/// Sends whatever text is left (the request ends).
fn flush(a: &mut Active, logprobs: Vec<TokenLogprob>) {
    a.text.push_str(&String::from_utf8_lossy(&a.pending));
    a.pending.clear();
    let text = a.text[a.sent.min(a.text.len())..].to_string();
    a.sent = a.text.len();
    if !text.is_empty() || !logprobs.is_empty() {
        let _ = a.job.events.send(Event::Text { text, logprobs });
    }
}

fn logprob_of(model: &Model, logits: &[f32], tok: u32, bytes: &[u8], k: usize) -> TokenLogprob {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let lse = max as f64
        + logits
            .iter()
            .map(|&x| ((x - max) as f64).exp())
            .sum::<f64>()
            .ln();
    let lp = |t: usize| (logits[t] as f64 - lse) as f32;
    let mut top: Vec<usize> = Vec::with_capacity(k + 1);
    for (i, &x) in logits.iter().enumerate() {
        if top.len() < k || top.last().is_some_and(|&j| x > logits[j]) {
            let at = top.partition_point(|&j| logits[j] >= x);
            top.insert(at, i);
            top.truncate(k);
        }
    }
    let tk = &model.tokenizer;
    TokenLogprob {
        token: String::from_utf8_lossy(bytes).into_owned(),
        bytes: bytes.to_vec(),
        logprob: lp(tok as usize),
        top: top
            .into_iter()
            .map(|t| {
                let b = tk.decode_token(t as u32);
                (String::from_utf8_lossy(&b).into_owned(), b, lp(t))
            })
            .collect(),
    }
}
