// Two streams for the CUDA backend's work: the main stream (the legacy default stream, where every
// op runs unless told otherwise) and one side stream for branches of the forward that do not depend
// on the ops issued beside them (Backend::side_begin). At decode batch 1 a layer is a chain of ~40
// latency-bound kernels that leave most SMs idle; the hc_mixes of a site and the shared expert then
// run beside the attention / routed experts instead of after them.
//
// What keeps it safe:
//  - side_begin orders the side stream after every op issued so far (an event on the main stream);
//    side_join orders the main stream after every side op issued so far.
//  - Device blocks freed on the host while side ops are pending are not reused until side_join
//    (device_memory.cu defers them): a side op's inputs, outputs and scratch cannot be handed to a
//    main op that would run beside it, nor a block a queued main op still reads to a side op.
//  - The persistent GEMM / MoE workspaces exist once per stream (gemm_workspace.cuh).
//  - Uploads from the host go through a staging ring per stream (device_memory.cu); a copy to the
//    host joins first.
// DEEPINFER_SIDE_STREAM=0 runs everything on the main stream (for measuring what the side stream
// gains, and for checking that it changes no bit).
#pragma once

#include <cuda_runtime.h>

namespace di::cuda {

cudaStream_t current_stream();  // the stream the calling op issues its work to
int stream_lane();              // 0 while on the main stream, 1 on the side stream
// The main stream from now on: null (the legacy default stream) or a created non-blocking stream, as a graph
// capture needs (the legacy stream cannot be captured). Only between steps.
void set_main_stream(cudaStream_t stream);

void side_begin();  // later work goes to the side stream, ordered after everything issued so far
void side_end();    // later work goes to the main stream again (not ordered after the side work)
void side_join();   // the main stream waits for the side work issued so far (no-op if none)
int side_mark();    // a mark of the side work issued so far (inside a side region too)
void side_wait(int mark);  // the main stream waits for the side work before `mark` (frees stay deferred)

}  // namespace di::cuda
