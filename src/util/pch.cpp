// Translation unit that carries the precompiled <torch/torch.h> shared by every target.
