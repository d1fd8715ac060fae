#pragma once

#include <cstdint>
#include <string>

namespace myriad {

// myriad-doctor's own options (besides myriad-train's).
struct DoctorOptions {
  double min_bandwidth = 0.0;  // GB/s between hosts; 0: only the comparison between hosts
  std::string message_size = "auto";
  int iters = 3;
  int64_t profile_batch = 0;
  bool model_table = false;
  // --model-table's machine.
  double gemm_tflops = 780.0;
  double memory_tbps = 4.0;
  double backbone_tflops = 200.0;
  double host_busbw = 350.0;  // GB/s
  double nic_gbits = 400.0;   // per GPU
  double latency_us = 30.0;
  int gpus_per_host = 8;
  std::string gpu_memory = "79G";
  std::string table_gpus = "8,16,32,64,128,256,512";
  std::string table_classes = "10M,30M,100M,300M,1G";
  std::string activation_per_image = "55M";
};

}  // namespace myriad
