"""A fixed synthetic rollout batch (random prompts and replies, GRPO-style groups) for update
tests that need no environment: the data-parallel worker, the micro-batching test, the GPU check;
and the random tiny Llama of the forward-level tests.
"""

from __future__ import annotations

import torch

from factor_cli.credit import PackedBatch
from factor_cli.policy.generation import score_replies
from factor_cli.rollout.packing import RolloutBatch


def synthetic_batch(
    model: torch.nn.Module,
    n_traj: int = 4,
    per: int = 2,
    prompt_len: int = 10,
    reply_len: int = 6,
    seed: int = 1,
    shared: bool = True,
) -> RolloutBatch:
    """``n_traj`` trajectories of ``per`` actions each, in groups of two with outcomes 1, 0, ...;
    each reply's first and last two tokens are non-action tokens; behaviour log-probs are the
    model's own minus 0.05, so the first update is off-policy by a known margin. ``shared``:
    the prompts share prefixes as a real batch's do (a common head, and each turn's prompt
    extends its trajectory's previous one), so shared-prefix forwards have something to share."""
    g = torch.Generator().manual_seed(seed)
    vocab = int(model.config.vocab_size)  # type: ignore[union-attr]
    n = n_traj * per
    replies = [torch.randint(5, vocab, (reply_len,), generator=g).tolist() for _ in range(n)]
    if shared:  # a common head; each later turn's prompt extends the one before
        head = torch.randint(5, vocab, (prompt_len // 2,), generator=g).tolist()
        prompts = []
        for i in range(n):
            if i % per == 0:
                tail = prompt_len - len(head)
                prompts.append(head + torch.randint(5, vocab, (tail,), generator=g).tolist())
            else:
                feedback = torch.randint(5, vocab, (2,), generator=g).tolist()
                prompts.append(prompts[-1] + replies[i - 1] + feedback)
    else:
        prompts = [torch.randint(5, vocab, (prompt_len,), generator=g).tolist() for _ in range(n)]
    masks = [[1 <= j < reply_len - 2 for j in range(reply_len)] for _ in replies]
    n_act_tok = sum(masks[0])
    sc = score_replies(model, prompts, replies, 1.0, 0)
    act = [lp.float().cpu()[torch.tensor(m)] for lp, m in zip(sc.logprobs, masks)]
    na = [lp.float().cpu()[~torch.tensor(m)] for lp, m in zip(sc.logprobs, masks)]
    traj = torch.repeat_interleave(torch.arange(n_traj), per)
    batch = PackedBatch(
        action_index=torch.repeat_interleave(torch.arange(n), n_act_tok),
        logp_old=torch.cat(act) - 0.05,
        traj_index=traj,
        group_index=torch.arange(n_traj) // 2,
        outcome=(torch.arange(n_traj) % 2 == 0).double(),
    ).validate()
    return RolloutBatch(
        batch,
        prompts,
        replies,
        masks,
        torch.cat(na) - 0.05,
        torch.repeat_interleave(traj, reply_len - n_act_tok),
        [""] * n,
        [(i // per, i % per) for i in range(n)],
    )


def random_llama(
    vocab: int, max_positions: int = 256, seed: int = 0, arch: str = "Llama", **extra: object
) -> torch.nn.Module:
    """A random 2-layer causal LM of family ``arch`` (hidden 32, 4 heads, 2 KV heads; ``extra``
    config fields, e.g. Mistral's ``sliding_window``), fp32, in eval mode, built from a config
    (nothing downloaded): the forward-level tests' model."""
    import transformers

    torch.manual_seed(seed)
    cfg = getattr(transformers, f"{arch}Config")(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        **extra,
    )
    return getattr(transformers, f"{arch}ForCausalLM")(cfg).float().eval()
