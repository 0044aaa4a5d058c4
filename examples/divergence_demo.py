"""Where does batch invariance break in a model? flash_attn_det's divergence finder on a tiny
random Llama (transformers), attention on flash_attn_det: one prompt alone against the same
prompt inside a right-padded batch, forward and the training step's backward. It prints, per
attention implementation, whether the prompt's logits are the same bits and the first op whose
inputs were bit-equal and whose outputs were not.

    python3 examples/divergence_demo.py [--device cuda]
"""
import argparse

import torch
import transformers

import flash_attn_det.integrations.transformers as fad_tf
from flash_attn_det import invariance as inv


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,
                                   num_hidden_layers=2, num_attention_heads=8,
                                   num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(args.device, torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 1000, (n,), generator=g).to(args.device) for n in (37, 64, 21)]
    logits = lambda ids, mask, pos: model(ids, attention_mask=mask,  # noqa: E731
                                          position_ids=pos).logits
    loss = lambda ids, mask, pos: logits(ids, mask, pos).float().logsumexp(-1).sum()  # noqa: E731
    print(f"{args.device}, torch {torch.__version__}, transformers {transformers.__version__}")
    for impl in (fad_tf.NAME, "sdpa", "eager"):
        model.set_attn_implementation(impl)
        try:
            inv.assert_batch_invariant(logits, prompts, side="right")
            same = "same bits"
        except AssertionError as exc:
            same = str(exc).split(";")[0]
        fwd = inv.find_divergence(logits, prompts, index=0, side="right", modules=[model])
        model.train()
        bwd = inv.find_divergence(loss, prompts, index=0, side="right", backward=True,
                                  modules=[model])
        model.eval()
        print(f"{impl:>13}: logits alone vs in the batch: {same}\n"
              f"{'':>15}forward:  {fwd}\n{'':>15}training step: {bwd}")


if __name__ == "__main__":
    main()
