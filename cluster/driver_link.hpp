#pragma once
// The link between a controller and one of its drivers.
//
// NOTE [driver link]: a driver started by a controller (`troupe driver`)
// publishes a small front actor on a loopback port as soon as it starts and
// writes <job dir>/driver.json ({pid, port}; it must survive a controller
// restart, so it stays a file). The controller, woken by the file's arrival
// (NOTE [supervision by events]), connects and asks the front two
// questions, each answered once the driver knows the answer:
//   workers_atom     → the workers it waits for (a job on nodes only: NOTE
//                      [remote workers]); the controller has their agents
//                      start them;
//   driver_job_atom  → its job actor, once spawned; the controller then
//                      subscribes to its events and forwards commands.
// and then, for a job on nodes, over and over:
//   replace_worker_atom → the next worker the driver wants again (NOTE
//                      [replacing a worker] in job_nodes.hpp); the
//                      controller answers with (replace_worker_atom,
//                      worker_replaced).
// The driver tells the front the same two facts with one-way messages. The
// questions wait without a deadline of their own: the front answers as the
// driver gets there, and a driver that ends (or never publishes within the
// controller's driver_start_timeout_s, when it is killed) takes the
// connection down, which ends the wait.

#include "cluster/job_nodes.hpp"

#include <caf/atom.hpp>
#include <caf/fwd.hpp>

namespace troupe::cluster {

using workers_atom = caf::atom_constant<caf::atom("workers")>;
using driver_job_atom = caf::atom_constant<caf::atom("djob")>;
/// (replace_worker_atom, worker_entry) from the driver → worker_replaced,
/// once the controller answers; (replace_worker_atom) from the controller
/// → the next such worker_entry; (replace_worker_atom, worker_replaced)
/// from the controller: its answer.
using replace_worker_atom = caf::atom_constant<caf::atom("rework")>;

/// Spawns the driver's front (untyped: the job actor travels as a plain
/// handle, cast back by the controller).
caf::actor spawn_driver_front(caf::actor_system& sys);

/// The driver's side of NOTE [replacing a worker]: asks the front for
/// worker `x` again and waits — without a deadline: the job waits for a
/// node — for the controller's answer. Fails when the front is gone or
/// the controller refused.
expected<job_node> ask_for_worker_again(caf::actor_system& sys, const caf::actor& front,
                                        const worker_entry& x);

} // namespace troupe::cluster
