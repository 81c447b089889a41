//! The reference model of the public API: plain, slow, obviously correct Rust that knows what
//! every call should answer, written from the proto's comments and the README, never from the
//! server's code.
//!
//! A run is a seeded sequence of [`Call`]s. Before each call the model says what the answer
//! must be ([`Expected`]: a code with the reasons allowed, and every field of the answer the
//! model can know); the runner sends the call to a real server and compares, then compares
//! the levels of every SKU at every location. A divergence is shrunk to the fewest calls that
//! still diverge and printed as `grpcurl` commands a person can paste against `make run`.
//!
//! Where the contract is silent, the model makes a choice and says so ([`Rules`] names the
//! ones a stricter reading of the contract would make otherwise).
//!
//! The model depends on the proto types and std only: it holds no connection, no clock and
//! no randomness of its own (the generator's is seeded).
//!
//! # Layout
//! - [`call`] — the calls a run is made of, with symbolic names (a reservation is the key of
//!   the `Reserve` that made it), and the requests they become in a namespace.
//! - [`model`] — the state (stock per SKU and location, reservations, receipts, orders, keys)
//!   and the rule of every call: what it answers and what it changes.
//! - [`view`] — answers as the model compares them: the fields it can know, taken from the
//!   server's messages or built from its own state.
//! - [`generate`] — seeded sequences of calls, weighted to reach the edges.
//! - [`shrink`] — the fewest calls that still diverge.
//! - [`grpcurl`] — a sequence of calls as commands to paste against `make run`.
//! - [`rng`] — the generator's seeded random numbers.
//! - [`mutants`] — the hand-written defects `make model-mutants` scores the model against
//!   (`mutants.txt`); the binary (`src/main.rs`) lists and applies them.

pub mod call;
pub mod generate;
pub mod grpcurl;
pub mod model;
pub mod mutants;
pub mod rng;
pub mod shrink;
pub mod view;

pub use call::{Call, LineSpec, Namespace, Request, State};
pub use model::{Expected, Model, Rules};
pub use view::{Answer, Code};
