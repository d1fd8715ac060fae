#include "myriad/train/checkpoint_backbone.h"

#include <filesystem>

#include "myriad/ckpt/checkpoint_store.h"
#include "myriad/ckpt/torch_file.h"
#include "myriad/model/onnx_graph.h"
#include "myriad/train/train_config.h"
#include "myriad/train/training_checkpoint.h"
#include "myriad/util/atomic_output.h"
#include "myriad/util/error.h"
#include "myriad/util/hdf5_file.h"
#include "myriad/util/log.h"

namespace myriad {

std::shared_ptr<Backbone> load_checkpoint_backbone(const std::string& directory,
                                                   BackboneOptions* options) {
  const Manifest manifest = verify_checkpoint(directory, {kReplicatedFile});
  const BackboneOptions built = backbone_options(
      train_config_from_ini(manifest.config, str_format("checkpoint '{}'", directory)));
  std::shared_ptr<Backbone> backbone = make_backbone(built);
  const Hdf5File replicated((std::filesystem::path(directory) / kReplicatedFile).string(),
                            Hdf5File::Mode::kRead);
  backbone->load_state_dict(read_backbone_state(replicated),
                            str_format("checkpoint '{}'", directory));
  backbone->eval();
  if (options != nullptr) *options = built;
  return backbone;
}

BackboneFormat parse_backbone_format(const std::string& text) {
  if (text == "state-dict") return BackboneFormat::kStateDict;
  if (text == "onnx") return BackboneFormat::kOnnx;
  throw UsageError(str_format("--format must be state-dict or onnx, got '{}'", text));
}

void export_backbone(const std::string& directory, const std::string& output,
                     BackboneFormat format) {
  BackboneOptions options;
  const std::shared_ptr<Backbone> backbone = load_checkpoint_backbone(directory, &options);
  if (format == BackboneFormat::kOnnx) {
    const std::vector<std::string> written = write_onnx(*backbone, options, output);
    log_info(
        "wrote {}: {} (insightface's {}) as ONNX, input 'data' [batch, {}, {}, {}] of pixels x / "
        "127.5 - 1, output 'embedding' [batch, {}]{}",
        output, options.name, insightface_name(options.name), options.input.channels,
        options.input.height, options.input.width, options.embedding_size,
        written.size() > 1 ? str_format(", weights in {}", written[1]) : "");
    return;
  }
  const StateDict state = backbone->state_dict();
  AtomicOutput out(output);
  write_torch_state_dict(state, out.temporary_path());
  out.commit();
  log_info(
      "wrote {}: the {} tensors of {} (insightface's {}), for torch.load and arcface_torch's "
      "load_state_dict",
      output, state.size(), options.name, insightface_name(options.name));
}

void init_backbone(Backbone& backbone, const std::string& path) {
  const StateDict state = read_torch_state_dict(path);
  backbone.load_state_dict(state, str_format("--init-backbone '{}'", path));
  log_info("backbone initialised from {} ({} tensors)", path, state.size());
}

}  // namespace myriad
