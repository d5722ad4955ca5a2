//! One-shot files by IP multicast on a LAN, with erasure-coded repair (sans-IO).
//!
//! The source sends the file once to a multicast group, cut into *symbols* (one datagram
//! each) grouped into *blocks* of `k` symbols. A receiver that lost some symbols of a block
//! does not ask for them: it says how many it still needs, and the source multicasts that
//! many *new* Reed-Solomon parity symbols of the block. Any `k` distinct symbols of a block
//! rebuild it, so one parity symbol repairs a different loss at every receiver: with
//! independent random loss the repair costs the worst receiver's loss per block, not the sum
//! over receivers (the sum is what a unicast repair per receiver costs the source's link, and
//! what held the feed's 8 receivers at 5% loss to 0.6 of the link).
//!
//! - [`layout`]: how a file is cut into blocks and symbols.
//! - [`fec`]: the erasure code (`reed-solomon-simd`, GF(2^16), any `k` of `k + m`).
//! - [`msg`]: the control messages (on the authenticated TCP connection to each receiver)
//!   and the datagram header.
//! - [`seal`]: datagrams sealed with AES-256-GCM under a group key drawn per session.
//! - [`sender`]: the source: pacing, first pass, parity granted on requests, end markers.
//! - [`receiver`]: a receiver: assembly, decoding, per-block hash checks, repair requests.
//! - [`train`]: the sending rate, measured from how fast the first symbols arrive.
//! - [`probe`]: the rate raised while the group keeps up, when the train saw only the
//!   source's own pace.
//! - `sim`: a seeded simulation of a source and many receivers on a lossy LAN (tests).
//!
//! Confidentiality and integrity: every datagram is sealed under the session's group key,
//! which reached each receiver on its encrypted connection ([`seal`]); a datagram that does
//! not open is counted and dropped. A receiver holds the key and could forge datagrams to the
//! others, so every block's BLAKE3 hash also travels on each receiver's authenticated
//! connection and a block is written only once it matches; a block that does not is dropped
//! and asked for again. Both ends given `--plaintext` send the datagrams in clear (the
//! hashes still hold).

pub mod fec;
pub mod layout;
pub mod msg;
pub mod probe;
pub mod receiver;
pub mod seal;
pub mod sender;
#[cfg(test)]
mod sim;
pub mod train;

/// Microseconds on the caller's clock.
pub type Micros = u64;

pub use layout::Layout;
pub use msg::McastMsg;
