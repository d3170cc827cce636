// keel/core/base/target_clones.h — KEEL_TARGET_CLONES: whether hot loops may be compiled as GCC target clones (several
// bodies of one function, e.g. for AVX-512 and for the baseline, one picked by an ifunc when the library is loaded).
//
// Off outside x86-64 GCC/Clang, and under ThreadSanitizer: it instruments the ifunc resolvers, which the dynamic loader
// runs while relocating a library, before TSan's runtime is set up, and every process of a TSan build crashed at load
// (a SIGSEGV inside _dl_relocate_object). Code that uses clones must compute the same values in every clone (no
// reassociation; `fp-contract=off` beside `O3`, since an `optimize` attribute does not keep the command line's ISO
// mode).
#pragma once

#if (defined(__x86_64__) && defined(__GNUC__)) && !defined(__SANITIZE_THREAD__)
#define KEEL_TARGET_CLONES 1
#else
#define KEEL_TARGET_CLONES 0
#endif
