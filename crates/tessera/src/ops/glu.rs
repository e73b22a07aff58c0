//! Gated linear units: swiglu, geglu, reglu (and geglu_erf, geglu_quick), fused (one source: each row's first half gated by its second, or swapped) or split (two sources).

use crate::error::Result;
use crate::reference::{Dense, NodeRef};

/// The activation applied to the gate half.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GluKind {
    Reglu,
    Geglu,
    Swiglu,
    GegluErf,
    GegluQuick,
}

impl GluKind {
    pub fn name(self) -> &'static str {
        match self {
            GluKind::Reglu => "reglu",
            GluKind::Geglu => "geglu",
            GluKind::Swiglu => "swiglu",
            GluKind::GegluErf => "geglu_erf",
            GluKind::GegluQuick => "geglu_quick",
        }
    }
}

pub(crate) fn reference(n: &NodeRef, _src: &[Dense]) -> Result<Dense> {
    Err(n.err("reference kernel not written yet"))
}
