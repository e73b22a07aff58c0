//! conv_2d (direct), im2col and pool_2d.

use crate::error::Result;
use crate::reference::{Dense, NodeRef};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    pub s0: usize,
    pub s1: usize,
    pub p0: usize,
    pub p1: usize,
    pub d0: usize,
    pub d1: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Im2colParams {
    pub s0: usize,
    pub s1: usize,
    pub p0: usize,
    pub p1: usize,
    pub d0: usize,
    pub d1: usize,
    pub is_2d: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    Max,
    Avg,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pool2dParams {
    pub kind: PoolKind,
    pub k0: usize,
    pub k1: usize,
    pub s0: usize,
    pub s1: usize,
    pub p0: usize,
    pub p1: usize,
}

pub(crate) fn reference(n: &NodeRef, _src: &[Dense]) -> Result<Dense> {
    Err(n.err("reference kernel not written yet"))
}
