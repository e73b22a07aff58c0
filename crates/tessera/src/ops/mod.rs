//! ggml's op set, one file per op family. Each file holds the family's parameter types, its
//! shape and type rules with the builders (`impl Graph` blocks), its reference kernel (scalar,
//! f64, obviously correct) and its tests. Backward rules join them with autodiff.

pub mod attention;
pub mod binary;
pub mod conv;
pub mod glu;
pub mod loss;
pub mod matmul;
pub mod misc;
pub mod norm;
pub mod optim;
pub mod reduce;
pub mod rope;
pub mod rows;
pub mod softmax;
pub mod sort;
pub mod unary;
pub mod view;

#[cfg(test)]
pub(crate) mod testutil;
