/* The workload's kernels as PTX, loaded with cuModuleLoadData. On a real GPU the driver
 * compiles them; simgpu knows them by name and simulates the same effects:
 *
 *   tgs_spin(u64 ns)
 *       runs for ns nanoseconds (every thread spins on %globaltimer).
 *   tgs_step(u64 ns, u64 a, u64 a_bytes, u64 b, u64 b_bytes, u32 stride, u32 delta)
 *       adds delta to the u32 at every address in [a, a+a_bytes) and [b, b+b_bytes)
 *       that is a multiple of stride, then runs until ns nanoseconds after it started,
 *       on any grid: only the blocks numbered below %nsmid (at least one per SM, all in
 *       the first wave) wait out the ns; the others end after their touches. Were every
 *       block to wait, a grid larger than the GPU holds at once would run in waves of
 *       ns each (on an H100, which holds 2,112 of these blocks, 2 ms kernels on
 *       10,000-15,000 blocks ran in 5-8 waves, about 13 ms), while simgpu runs every
 *       launch ns, whatever its grid.
 *
 * Both kernels use a grid-stride loop, so any launch shape covers the whole range. */
#ifndef TGS_WORKLOAD_KERNELS_H
#define TGS_WORKLOAD_KERNELS_H

/* The touch of one range: %rd4 = start, %rd5 = bytes (clobbers %rd6-%rd11, %r9, %p1). */
#define TGS_PTX_TOUCH(L)                                        \
    "  add.u64 %rd6, %rd4, %rd5;\n"                             \
    "  add.u64 %rd7, %rd4, %rd3;\n"                             \
    "  sub.u64 %rd7, %rd7, 1;\n"                                \
    "  div.u64 %rd7, %rd7, %rd3;\n"                             \
    "  mul.lo.u64 %rd7, %rd7, %rd3;\n"                          \
    "  mul.lo.u64 %rd8, %rd1, %rd3;\n"                          \
    "  add.u64 %rd9, %rd7, %rd8;\n"                             \
    "  mul.lo.u64 %rd10, %rd2, %rd3;\n"                         \
    "$L" L "_loop:\n"                                           \
    "  add.u64 %rd11, %rd9, 4;\n"                               \
    "  setp.gt.u64 %p1, %rd11, %rd6;\n"                         \
    "  @%p1 bra $L" L "_done;\n"                            \
    "  ld.global.u32 %r9, [%rd9];\n"                            \
    "  add.u32 %r9, %r9, %r8;\n"                                \
    "  st.global.u32 [%rd9], %r9;\n"                            \
    "  add.u64 %rd9, %rd9, %rd10;\n"                            \
    "  bra.uni $L" L "_loop;\n"                                 \
    "$L" L "_done:\n"

static const char tgs_workload_ptx[] =
    "//\n"
    "// tgs-workload kernels (hand-written PTX; see kernels.h)\n"
    "//\n"
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry tgs_spin(\n"
    "  .param .u64 tgs_spin_ns\n"
    ")\n"
    "{\n"
    "  .reg .pred %p<2>;\n"
    "  .reg .b64 %rd<6>;\n"
    "  ld.param.u64 %rd1, [tgs_spin_ns];\n"
    "  mov.u64 %rd2, %globaltimer;\n"
    "$Lspin:\n"
    "  mov.u64 %rd3, %globaltimer;\n"
    "  sub.u64 %rd4, %rd3, %rd2;\n"
    "  setp.lt.u64 %p1, %rd4, %rd1;\n"
    "  @%p1 bra $Lspin;\n"
    "  ret;\n"
    "}\n"
    "\n"
    ".visible .entry tgs_step(\n"
    "  .param .u64 tgs_step_ns,\n"
    "  .param .u64 tgs_step_a,\n"
    "  .param .u64 tgs_step_a_bytes,\n"
    "  .param .u64 tgs_step_b,\n"
    "  .param .u64 tgs_step_b_bytes,\n"
    "  .param .u32 tgs_step_stride,\n"
    "  .param .u32 tgs_step_delta\n"
    ")\n"
    "{\n"
    "  .reg .pred %p<4>;\n"
    "  .reg .b32 %r<12>;\n"
    "  .reg .b64 %rd<24>;\n"
    "  mov.u64 %rd20, %globaltimer;\n"
    "  mov.u32 %r1, %ctaid.x;\n"
    "  mov.u32 %r2, %ntid.x;\n"
    "  mov.u32 %r3, %tid.x;\n"
    "  mov.u32 %r4, %nctaid.x;\n"
    "  mad.lo.u32 %r5, %r1, %r2, %r3;\n"
    "  mul.lo.u32 %r6, %r4, %r2;\n"
    "  cvt.u64.u32 %rd1, %r5;\n"
    "  cvt.u64.u32 %rd2, %r6;\n"
    "  ld.param.u32 %r7, [tgs_step_stride];\n"
    "  cvt.u64.u32 %rd3, %r7;\n"
    "  ld.param.u32 %r8, [tgs_step_delta];\n"
    "  ld.param.u64 %rd4, [tgs_step_a];\n"
    "  ld.param.u64 %rd5, [tgs_step_a_bytes];\n"
    TGS_PTX_TOUCH("a")
    "  ld.param.u64 %rd4, [tgs_step_b];\n"
    "  ld.param.u64 %rd5, [tgs_step_b_bytes];\n"
    TGS_PTX_TOUCH("b")
    "  mov.u32 %r10, %nsmid;\n"
    "  setp.ge.u32 %p2, %r1, %r10;\n"
    "  @%p2 bra $Lend;\n"
    "  ld.param.u64 %rd15, [tgs_step_ns];\n"
    "$Lwait:\n"
    "  mov.u64 %rd16, %globaltimer;\n"
    "  sub.u64 %rd17, %rd16, %rd20;\n"
    "  setp.lt.u64 %p3, %rd17, %rd15;\n"
    "  @%p3 bra $Lwait;\n"
    "$Lend:\n"
    "  ret;\n"
    "}\n";

#endif
