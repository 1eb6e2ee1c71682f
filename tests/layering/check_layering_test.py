#!/usr/bin/env python3
"""Unit tests of scripts/check_layering.py on small fixture trees made in a
temporary directory: each rule is shown to fire on the include that breaks it
and to stay quiet on its allowed neighbours."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "check_layering.py")
spec = importlib.util.spec_from_file_location("check_layering", SCRIPT)
check_layering = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_layering)

# A clean tree: every arrow points down or sideways.
CLEAN = {
    "runtime/error.hpp": "#pragma once\n#include <string>\n",
    "runtime/plain.cpp": '#include "runtime/error.hpp"\n#include "troupe/v1/env.pb.h"\n',
    "kernels/gae.hpp": '#include "runtime/error.hpp"\n#include <ATen/core/Tensor.h>\n',
    "models/llama.hpp": '#include "kernels/gae.hpp"\n#include <torch/torch.h>\n',
    "actors/weight_channel.hpp": '#include "runtime/error.hpp"\n',
    "actors/train/engine.hpp": '#include "actors/weight_channel.hpp"\n#include "models/llama.hpp"\n',
    "actors/train/engine.cpp": '#include "actors/train/engine.hpp"\n#include <torch/torch.h>\n',
    "actors/inference/rollout.hpp": '#include "actors/weight_channel.hpp"\n',
    "actors/rl/driver.cpp": '#include "actors/job/job_actor.hpp"\n#include "actors/train/engine.hpp"\n',
    "actors/job/job_actor.hpp": '#include "actors/weight_channel.hpp"\n',
    "cluster/api.cpp": '#include "troupe/v1/job_service.grpc.pb.h"\n#include "actors/rl/driver.hpp"\n',
    "apps/main.cpp": '#include "cluster/api.hpp"\n#include "troupe/v1/job_service.grpc.pb.h"\n',
    "tests/anything_test.cpp": '#include "apps/main.hpp"\n',
}


def make_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


class LayeringChecker(unittest.TestCase):
    def check_with(self, extra):
        with tempfile.TemporaryDirectory() as root:
            files = dict(CLEAN)
            files.update(extra)
            make_tree(root, files)
            return check_layering.check_tree(root)

    def test_clean_tree_passes(self):
        self.assertEqual(self.check_with({}), [])

    def test_upward_include_is_reported_with_file_and_line(self):
        report = self.check_with({"runtime/bad.cpp": '// x\n#include "actors/job/job_actor.hpp"\n'})
        self.assertEqual(len(report), 1)
        self.assertTrue(report[0].startswith("runtime/bad.cpp:2: "), report)
        self.assertIn("runtime/ includes actors/", report[0])

    def test_each_upward_pair_of_neighbours(self):
        layers = check_layering.LAYERS
        for low, high in zip(layers, layers[1:]):
            report = self.check_with({f"{low}/up.hpp": f'#include "{high}/x.hpp"\n'})
            self.assertEqual(len(report), 1, (low, high, report))
            self.assertIn(f"{low}/ includes {high}/", report[0])

    def test_grpc_header_outside_cluster_and_apps(self):
        for folder in ("runtime", "kernels", "models", "actors"):
            report = self.check_with({f"{folder}/rpc.cpp": '#include "troupe/v1/job_service.grpc.pb.h"\n'})
            self.assertEqual(len(report), 1, (folder, report))
            self.assertIn("generated gRPC header", report[0])

    def test_protobuf_messages_only_where_allowed(self):
        report = self.check_with({"actors/rl/msg.cpp": '#include "troupe/v1/env.pb.h"\n'})
        self.assertEqual(len(report), 1, report)
        self.assertIn("generated protobuf header", report[0])

    def test_trainer_including_rollout(self):
        report = self.check_with({"actors/train/bad.hpp": '#include "actors/inference/rollout.hpp"\n'})
        self.assertEqual(len(report), 1, report)
        self.assertIn("actors/train -> actors/inference", report[0])

    def test_job_actor_including_rl(self):
        report = self.check_with({"actors/job/bad.cpp": '#include "actors/rl/driver.hpp"\n'})
        self.assertEqual(len(report), 1, report)
        self.assertIn("actors/job -> actors/rl", report[0])

    def test_torch_in_light_public_headers(self):
        for folder in ("runtime", "actors", "cluster", "apps"):
            report = self.check_with({f"{folder}/heavy.hpp": "#include <torch/torch.h>\n"})
            self.assertEqual(len(report), 1, (folder, report))
            self.assertIn("<torch/torch.h> in a public header", report[0])
        # A .cpp may include it; so may a models/ header.
        self.assertEqual(self.check_with({"cluster/heavy.cpp": "#include <torch/torch.h>\n"}), [])

    def test_command_line_exit_codes(self):
        with tempfile.TemporaryDirectory() as root:
            make_tree(root, CLEAN)
            ok = subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)
            self.assertEqual(ok.returncode, 0, ok.stdout + ok.stderr)
            make_tree(root, {"kernels/up.cpp": '#include "models/llama.hpp"\n'})
            bad = subprocess.run([sys.executable, SCRIPT, root], capture_output=True, text=True)
            self.assertEqual(bad.returncode, 1)
            self.assertIn("kernels/up.cpp:1:", bad.stdout)
        with tempfile.TemporaryDirectory() as empty:
            self.assertEqual(subprocess.run([sys.executable, SCRIPT, empty], capture_output=True).returncode, 2)


if __name__ == "__main__":
    unittest.main()
