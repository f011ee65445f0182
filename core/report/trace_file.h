// log.trace_file (docs/profiling.md): the spans every rank recorded, as one Chrome
// trace-event JSON file that Perfetto (ui.perfetto.dev) and chrome://tracing open: a process
// per rank, a track for the compute thread and one for collectives in flight, each span
// carrying its bytes and FLOPs.
#pragma once

#include <string>
#include <vector>

#include "kernels/profiler.h"
#include "parallel/comm.h"

namespace ulysses {

// One rank's spans as trace events (a JSON array's elements, comma-separated).
std::string trace_events_json(const std::vector<TraceSpan>& spans, int rank);

// Collective: gathers every rank's spans and rank 0 writes them to path (under a temporary
// name, then renamed).
void write_trace_file(Comm& world, const std::vector<TraceSpan>& spans, const std::string& path);

}  // namespace ulysses
