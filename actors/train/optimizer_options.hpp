#pragma once
// Optimizer settings of a training engine (AdamW), with the config visitor
// that reads them from a job file (NOTE [config visitors]).

#include <cstdint>

namespace troupe::actors::train {

struct optimizer_options {
  double lr = 1e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  /// Clip the global gradient norm to this; 0 = off.
  double grad_clip = 1.0;
  /// Linear warm-up steps from 0 to lr.
  int64_t warmup_steps = 0;
};

template <class V>
void visit(V& v, optimizer_options& c) {
  v.field("lr", c.lr, "AdamW learning rate");
  v.field("weight_decay", c.weight_decay);
  v.field("beta1", c.beta1);
  v.field("beta2", c.beta2);
  v.field("eps", c.eps);
  v.field("grad_clip", c.grad_clip, "Clip the global gradient norm; 0 = off");
  v.field("warmup_steps", c.warmup_steps, "Linear warm-up of the learning rate");
}

} // namespace troupe::actors::train
