//! Topological order of the nodes needed for a set of outputs.

use super::Graph;
use crate::op::Op;
use crate::tensor::TensorId;

impl Graph {
    /// Every tensor needed to compute `outputs`, sources before users (iterative DFS, so deep
    /// graphs do not overflow the stack). Leaves are included.
    pub fn topo_order(&self, outputs: &[TensorId]) -> Vec<TensorId> {
        let mut state = vec![0u8; self.len()]; // 0 new, 1 on stack, 2 done
        let mut order = Vec::new();
        let mut stack: Vec<(TensorId, usize)> = Vec::new();
        for &out in outputs {
            if state[out.index()] != 0 {
                continue;
            }
            stack.push((out, 0));
            state[out.index()] = 1;
            while let Some(&mut (id, ref mut next)) = stack.last_mut() {
                let t = self.tensor(id);
                let deps = t.src.len() + usize::from(t.view_of.is_some());
                if *next < deps {
                    let dep = if *next < t.src.len() {
                        t.src[*next]
                    } else {
                        t.view_of.map(|v| v.src).unwrap_or(id)
                    };
                    *next += 1;
                    if state[dep.index()] == 0 {
                        state[dep.index()] = 1;
                        stack.push((dep, 0));
                    }
                } else {
                    state[id.index()] = 2;
                    order.push(id);
                    stack.pop();
                }
            }
        }
        order
    }

    /// The op nodes (not leaves) in topological order for `outputs`.
    pub fn nodes_for(&self, outputs: &[TensorId]) -> Vec<TensorId> {
        self.topo_order(outputs)
            .into_iter()
            .filter(|&id| self.tensor(id).op != Op::Leaf)
            .collect()
    }
}
