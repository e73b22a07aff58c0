//! Graphviz dump of a graph.

use super::Graph;
use crate::op::Op;
use crate::shape::fmt_ne;
use crate::tensor::TensorId;
use std::fmt::Write;

impl Graph {
    /// A `dot` description of everything `outputs` needs: leaves as boxes (params bold, inputs
    /// green), op nodes as ellipses labelled with op, type and shape; views dashed.
    pub fn to_dot(&self, outputs: &[TensorId]) -> String {
        let mut s =
            String::from("digraph tessera {\n  rankdir=TB;\n  node [fontname=\"monospace\"];\n");
        for id in self.topo_order(outputs) {
            let t = self.tensor(id);
            let name = if t.name.is_empty() {
                String::new()
            } else {
                format!("{}\\n", escape(&t.name))
            };
            let label = format!("{}{} {} {}", name, t.op, t.dtype, fmt_ne(&t.ne));
            let mut attrs = vec![format!("label=\"{label}\"")];
            if t.op == Op::Leaf {
                attrs.push("shape=box".into());
            }
            if t.op.is_view() {
                attrs.push("style=dashed".into());
            }
            if t.flags.param {
                attrs.push("penwidth=3".into());
            }
            if t.flags.input {
                attrs.push("color=darkgreen".into());
            }
            if t.flags.output || t.flags.loss {
                attrs.push("color=red".into());
            }
            let _ = writeln!(s, "  n{} [{}];", id.0, attrs.join(", "));
            for (i, src) in t.src.iter().enumerate() {
                let _ = writeln!(s, "  n{} -> n{} [label=\"{}\"];", src.0, id.0, i);
            }
        }
        s.push_str("}\n");
        s
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}
