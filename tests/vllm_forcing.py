"""A logits processor for vLLM (its v1 interface, `--logits-processors vllm_forcing:ForcedAnswer`) that makes each
request's greedy answer the token ids listed in the JSON file `FORCED_IDS` names, read when the request arrives:
vLLM's counterpart of tiny_models.ForcedAnswer, for tests/test_vllm_peer.py. It runs inside vLLM's own virtual
environment, so it imports only vLLM and torch."""

import json
import os

from vllm.v1.sample.logits_processor import LogitsProcessor, process_dict_updates


class ForcedAnswer(LogitsProcessor):
    def __init__(self, vllm_config, device, is_pin_memory):
        self.requests = {}  # batch row -> (the forced ids, the request's output ids so far)

    def is_argmax_invariant(self) -> bool:
        return False  # it changes what greedy decoding picks

    def update_state(self, batch_update) -> None:
        process_dict_updates(self.requests, batch_update, self._forced)

    @staticmethod
    def _forced(params, prompt_ids, output_ids):
        with open(os.environ["FORCED_IDS"]) as file:
            return json.load(file), output_ids

    def apply(self, logits):
        for row, (ids, output) in self.requests.items():
            if not ids:  # nothing forced: the model answers as it would
                continue
            token = ids[min(len(output), len(ids) - 1)]
            logits[row] = float("-inf")
            logits[row, token] = 0.0
        return logits
