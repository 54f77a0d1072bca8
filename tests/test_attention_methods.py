"""The four attention baselines against plain per-image loops over an independent forward."""
import torch

import vitexplain

from conftest import make_vit
from reference import manual_forward


def _reference(model, images, target):
    """Per image: attentions and their gradients of the target logit, from the written-out forward."""
    out = []
    for i in range(images.shape[0]):
        logits, attentions, _ = manual_forward(model, images[i:i + 1])
        logits[0, target[i]].backward()
        out.append([(a.detach()[0], a.grad[0]) for a in attentions])
    return out


def test_four_methods_against_plain_loops(images):
    model = make_vit(distilled=True, depth=3)
    prefix = model.num_prefix_tokens
    target = torch.tensor([1, 4, 4, 9])
    reference = _reference(model, images, target)
    methods = ("raw_attention", "rollout", "attn_gradcam", "gae")
    got = {m: vitexplain.explain(model, images, m, target=target) for m in methods}
    got_start = vitexplain.explain(model, images, "rollout", start_layer=1, head_fusion="max")
    for i, layers in enumerate(reference):
        n = layers[0][0].shape[-1]
        eye = torch.eye(n)
        attn_last, grad_last = layers[-1]
        raw = sum(attn_last[h, 0, prefix:] for h in range(attn_last.shape[0])) / attn_last.shape[0]
        torch.testing.assert_close(got["raw_attention"][i].flatten(), raw, rtol=1e-5, atol=1e-6)

        for start, fusion, result in ((0, "mean", got["rollout"][i]), (1, "max", got_start[i])):
            joint = eye
            for attn, _ in layers[start:]:
                fused = attn.mean(0) if fusion == "mean" else attn.max(0).values
                a = fused + eye
                a = a / a.sum(-1, keepdim=True)
                joint = a @ joint
            torch.testing.assert_close(result.flatten(), joint[0, prefix:], rtol=1e-5, atol=1e-6)

        weights = [grad_last[h, 0, prefix:].mean() for h in range(grad_last.shape[0])]
        cam = sum(w * attn_last[h, 0, prefix:] for h, w in enumerate(weights)) / len(weights)
        torch.testing.assert_close(got["attn_gradcam"][i].flatten(), cam.clamp(min=0), rtol=1e-4, atol=1e-7)

        relevance = eye.clone()
        for attn, grad in layers:
            relevance = relevance + (grad * attn).clamp(min=0).mean(0) @ relevance
        torch.testing.assert_close(got["gae"][i].flatten(), relevance[0, prefix:], rtol=1e-4, atol=1e-7)


def test_rollout_discard_ratio_drops_the_smallest_weights_but_not_the_class_token(images):
    model = make_vit()
    plain = vitexplain.explain(model, images, "rollout")
    sharp = vitexplain.explain(model, images, "rollout", discard_ratio=0.9)
    assert not torch.allclose(plain, sharp)
    from vitexplain.methods.rollout import discard_lowest

    attn = torch.tensor([[[0.1, 0.5], [0.3, 0.2]]])
    kept = discard_lowest(attn, 0.5, keep_index=0)
    # the two smallest entries are 0.1 (protected: class token to itself) and 0.2, then 0.3
    torch.testing.assert_close(kept, torch.tensor([[[0.1, 0.5], [0.0, 0.0]]]))


def test_class_specific_methods_depend_on_the_target(images):
    model = make_vit()
    for method in ("attn_gradcam", "gae"):
        assert not torch.allclose(vitexplain.explain(model, images, method, target=0),
                                  vitexplain.explain(model, images, method, target=5))
    for method in ("raw_attention", "rollout"):
        torch.testing.assert_close(vitexplain.explain(model, images, method, target=0),
                                   vitexplain.explain(model, images, method, target=5))
