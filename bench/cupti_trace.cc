// A CUPTI injection library that records when every kernel ran, inside replayed graphs too:
//   CUDA_INJECTION64_PATH=libtailserve_cupti_trace.so TAILSERVE_TRACE_OUT=trace.tsv <program>
// writes one line per kernel at exit: start and end in ns, graph id, graph node id, grid, name,
// then when the driver queued it and submitted it to the GPU (ns, 0 if unknown), its hardware
// channel and stream, and its cluster size; bench/trace_table.py turns it into where a replayed
// step's time goes. Kernels launched programmatically start early (their CTAs wait inside), so
// what a kernel costs the step is the distance between its end and its predecessor's, not its
// own start-to-end span.
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Record {
  unsigned long long start, end, node, queued, submitted;
  unsigned graph, grid, channel, stream, cluster;
  std::string name;
};

std::mutex mu;
std::vector<Record>* records = new std::vector<Record>();  // leaked: read in the exit handler

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 16 << 20;
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    records->push_back({k->start, k->end, k->graphNodeId, k->queued, k->submitted, k->graphId,
                        static_cast<unsigned>(k->gridX) * k->gridY * k->gridZ, k->channelID, k->streamId,
                        k->clusterX * k->clusterY * k->clusterZ, k->name ? k->name : "?"});
  }
  free(buffer);
}

void Flush() {
  cuptiActivityFlushAll(1);
  const char* path = getenv("TAILSERVE_TRACE_OUT");
  FILE* f = fopen(path ? path : "trace.tsv", "w");
  if (!f) return;
  std::lock_guard<std::mutex> lock(mu);
  for (const Record& r : *records) {
    fprintf(f, "%llu\t%llu\t%u\t%llu\t%u\t%s\t%llu\t%llu\t%u\t%u\t%u\n", r.start, r.end, r.graph, r.node, r.grid,
            r.name.c_str(), r.queued, r.submitted, r.channel, r.stream, r.cluster);
  }
  fclose(f);
  fprintf(stderr, "cupti_trace: %zu kernels written to %s\n", records->size(), path ? path : "trace.tsv");
}

}  // namespace

extern "C" int InitializeInjection(void) {
  if (cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted) != CUPTI_SUCCESS) return 0;
  if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) return 0;
  cuptiActivityEnableLatencyTimestamps(1);  // `queued` and `submitted`; the trace is still useful without them
  atexit(Flush);
  return 1;
}
