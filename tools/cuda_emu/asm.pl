# Perl substitutions (perl -0p) that give the kernels' inline-PTX helpers host bodies with the same
# meaning, the launch syntax a host call, __launch_bounds__ a check in the kernel's body and each
# __shared__ array a static that the block's first thread to reach it fills with garbage:
# tools/cuda_emu/build.sh applies them to each .cu file.
s/(__device__ __forceinline__ void ld_weights_if\(uint4 &v, const char \*p, bool ok\) \{).*?\n\}/$1 if (ok) v = *(const uint4 *)p; }/s;
s/(__device__ __forceinline__ void cp_async4\(float \*dst, const float \*src\) \{).*?\n\}/$1 *dst = *src; }/s;
s/asm volatile\("cp\.async\.wait_all;" ::: "memory"\);//g;
s/(unsigned b1\) \{)\s*float d\[4\];\s*asm volatile\(.*?\);/$1\n    float d[4];\n    emu_mma_bf16(d, a0, a1, a2, a3, b0, b1);/s;
s/(__device__ __forceinline__ void mma_i8\(int c\[4\], uint4 a, unsigned b0, unsigned b1\) \{).*?\n\}/$1\n    emu_mma_i8(c, a.x, a.y, a.z, a.w, b0, b1);\n}/s;
s/(__device__ __forceinline__ void prefetch_l2\(const char \*p\)) \{.*?\}/$1 {}/;
s/__grid_constant__//g;
s/([\w:]+(?:<[^<>;]*>)?)\s*<<<(.+?)>>>\s*\((.*?)\);/my ($k, $c, $a) = ($1, $2, $3); "emu_launch_kernel($k, $c" . ($a =~ m{\S} ? ", $a" : "") . ");"/gse;
s/extern __shared__ (\w+) (\w+)\[\];/$1 *$2 = ($1 *)emu_dyn_smem;/g;
s/__launch_bounds__(\((?:[^()]++|(?1))*\))(.*?\{)/$2 emu_launch_bounds$1;/gs;
s{__shared__\s+([^;]*);}{
    my $decl = $1;
    my $regs = join '', map { /(\w+)\s*(?:\[[^,]*)?$/ ? " static emu_shared_array emu_shared_${\ ++$main::n}(&$1, sizeof $1); emu_shared_$main::n.arrive();" : '' } split /,/, $decl;
    "static $decl;$regs"
}ge;
