//! Futures made in their box rather than moved into it.
//!
//! `Box::pin(make())` makes the future on the stack and then copies it whole into the
//! allocation, the bytes of every state it is not yet in included: a request's state is
//! about 4.8 KiB, and that copy cost about 480 instructions a request (callgrind). When
//! the allocation exists first, the compiler hands it to the maker as the place to build
//! in, and the copy goes away: [`boxed`] allocates, then makes (`Box::new_uninit` and
//! `Box::write`, no `unsafe`).
//!
//! `Box::write` is Rust 1.87's; sluice builds with 1.85 (Debian's `cargo`), where
//! [`boxed`] is `Box::pin(make())`: correct, one copy slower. Filling an empty slot
//! with `Pin::set` instead (safe on 1.85) was measured and does not avoid the copy.
//!
//! The maker must be a call that is not inlined into the caller (an `async fn`, or a
//! function marked `#[inline(never)]`): inlined, it builds on the stack again. Each
//! call site is kept because callgrind showed its copy gone.

use std::pin::Pin;

/// The value `make` makes (a future), built in its box.
#[rustversion::since(1.87)]
#[allow(clippy::incompatible_msrv)] // compiled only from 1.87 on
#[inline(always)]
pub(crate) fn boxed<F>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    let slot = Box::new_uninit();
    Box::into_pin(Box::write(slot, make()))
}

/// The value `make` makes (a future), built on the stack and moved into its box.
#[rustversion::before(1.87)]
#[inline(always)]
pub(crate) fn boxed<F>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::pin(make())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_boxed_future_runs_to_its_output() {
        let v = String::from("abc");
        let out = boxed(|| async move {
            tokio::task::yield_now().await;
            v.len()
        })
        .await;
        assert_eq!(out, 3);
    }
}
