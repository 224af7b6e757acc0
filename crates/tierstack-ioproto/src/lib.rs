//! The channel between the interception client (`libtierstack_io.so`, crate `tierstack-io`)
//! and a mount's daemon (`tierstack_fs::io`): the messages ([`msg`]) and the shared-memory
//! slot they travel in ([`chan`]).
//!
//! A client process connects to the mount's io socket (`<run dir>/<hash>.io`, beside the
//! control socket); the daemon checks its credentials (`SO_PEERCRED`), answers with a hello
//! (the mountpoint it serves) and a memfd holding one [`chan::Slot`]. From then on a call is a
//! request written into the slot, a state word flipped, and the answer read back from the same
//! buffer: no system call while both sides are running (each spins a bounded time, then
//! sleeps on a futex of the state word). The socket stays open only so that each side sees
//! the other go (hang-up).

pub mod cache;
pub mod chan;
pub mod msg;
pub mod vers;

pub use chan::{Chan, ChanError, Side};
pub use msg::{Deps, Rep, Req, SetAttr, Time, WireAttr};
pub use vers::Versions;
