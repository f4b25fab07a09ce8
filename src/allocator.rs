//! The global allocator: mimalloc, asked through its plain entry points whenever the
//! alignment asked for is one every mimalloc block has.
//!
//! Why sluice writes this instead of using the `mimalloc` crate's allocator: that one
//! sends every allocation through `mi_malloc_aligned`, and mimalloc serves an aligned
//! request above 1 KiB whose size class is not a power of two by over-allocating
//! (`size + alignment - 1`, through its generic path). A proxied request makes about
//! five such allocations (header maps, a request's boxed state, buffers); callgrind
//! counted the detour at several hundred instructions a request (docs/performance.md,
//! "sixth part"). This is the only `unsafe` in sluice: four calls that forward a
//! `Layout` to the C allocator, with the rule `malloc` itself follows (an alignment of
//! at most 16 bytes, and not above the size, is what every block of that size has).
//!
//! mimalloc's 2.x line (`libmimalloc-sys`'s `v2` feature), not the 3.x line the crate
//! builds by default: measured on the plain proxy (docs/performance.md, tenth part),
//! 3.x holds 2,359 bytes for an idle keep-alive connection against 815, and its search
//! for a page with free blocks grows with the connections in flight (+1,287
//! instructions a request from 16 to 256 connections, against +356).

#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every mimalloc block of at least this many bytes has
/// (`MI_MAX_ALIGN_SIZE`); smaller blocks are aligned to their size class, a multiple
/// of 8.
const PLAIN_ALIGN: usize = 16;

pub struct Mimalloc;

/// Whether a plain allocation of `size` bytes is aligned enough for `align`.
fn plain(align: usize, size: usize) -> bool {
    align <= PLAIN_ALIGN && align <= size
}

// SAFETY: every method forwards to mimalloc, which returns null or a block of at least
// `size` bytes aligned as asked (the plain functions only where `plain` holds, which
// mimalloc guarantees for them); `mi_free` takes blocks from either family.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi::mi_malloc(layout.size()) as *mut u8
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi::mi_zalloc(layout.size()) as *mut u8
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from one of the methods above (the caller's contract).
        unsafe { mi::mi_free(ptr as *mut c_void) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout` (the caller's contract);
        // the new block keeps the alignment, by the same rule as `alloc`.
        unsafe {
            if plain(layout.align(), new_size) {
                mi::mi_realloc(ptr as *mut c_void, new_size) as *mut u8
            } else {
                mi::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size from 1 byte to 9 KiB, at every alignment up to 4 KiB: the block is
    /// aligned as asked, holds what was written, and keeps it through a realloc.
    #[test]
    fn blocks_are_aligned_as_asked_and_keep_their_bytes() {
        let a = Mimalloc;
        for align in (0..=12).map(|s| 1usize << s) {
            for size in (1..=9 * 1024).step_by(7) {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; the block is freed with the same layout.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null() && p as usize % align == 0, "{size}/{align}");
                    std::ptr::write_bytes(p, 0xa5, size);
                    let q = a.realloc(p, layout, size * 2);
                    assert!(
                        !q.is_null() && q as usize % align == 0,
                        "{size}/{align} grown"
                    );
                    assert!((0..size).all(|i| *q.add(i) == 0xa5), "{size}/{align} kept");
                    a.dealloc(q, Layout::from_size_align(size * 2, align).unwrap());
                    let z = a.alloc_zeroed(layout);
                    assert!(!z.is_null() && z as usize % align == 0);
                    assert!((0..size).all(|i| *z.add(i) == 0), "{size}/{align} zeroed");
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
