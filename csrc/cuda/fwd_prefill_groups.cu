/*
 * fwd_prefill_groups.cu — the group walk's variants of the prefill kernel
 * (fwd_kernel<..., kGroups>, fwd_prefill_kernel.cuh), which launch_prefill
 * (fwd_prefill.cu) launches for a one-CTA plan past FAD_MERGE_GROUP splits.
 *
 * A file of their own for build time alone: setup.py compiles the kernel files
 * side by side, and with these 32 kernels fwd_prefill.cu was the build's longest
 * file, and so its critical path. Two files at a time on 2 cores (nvcc 13.0):
 * fwd_prefill.cu took 131 s at sm_90a and 101 s at sm_80 with them; split, it
 * takes 93 s and 50 s, this file 57 s and 46 s, and the whole nvcc step went
 * from 228 to 197 s (sm_90a) and from 131 to 98 s (sm_80). The kernels are the
 * same template and compile to the same SASS either way (dev/sass_compare.py).
 */
#include "fwd_prefill_kernel.cuh"

template <typename T, int kHeadDim, bool kMod, bool kPaged>
fwd_kernel_fn fwd_groups_kernel()
{
    return fwd_kernel<T, kHeadDim, kMod, kPaged, false, false, true>;
}

#define FAD_INST(T, D, MOD, PAGED) template fwd_kernel_fn fwd_groups_kernel<T, D, MOD, PAGED>();
FAD_FWD_VARIANTS(FAD_INST)
