// Whether the calling thread is capturing a step graph (device::StepGraph): the few backend paths that
// wait for the device (read-backs, the upload ring's reuse) must not, and say so instead.
#pragma once

namespace di::cuda {

bool capturing_step();

}  // namespace di::cuda
