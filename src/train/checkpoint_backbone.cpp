#include "myriad/train/checkpoint_backbone.h"

#include <filesystem>

#include "myriad/ckpt/checkpoint_store.h"
#include "myriad/ckpt/torch_file.h"
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

void export_backbone(const std::string& directory, const std::string& output) {
  BackboneOptions options;
  const std::shared_ptr<Backbone> backbone = load_checkpoint_backbone(directory, &options);
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
