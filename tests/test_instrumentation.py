import pytest
import timm
import torch

import vitexplain
from vitexplain.instrumentation import UnsupportedModelError, adapter_for
from vitexplain.instrumentation import adapter as adapter_module

from conftest import make_vit
from reference import manual_forward


def _images_for(name, batch=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    size = (40, 24) if name == "dynamic" else (32, 32)
    return torch.randn(batch, 3, *size, generator=g)


def _snapshot(model):
    """Everything instrumentation could leave behind."""
    return {
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "params": [p.detach().clone() for p in model.parameters()],
        "fused": [getattr(m, "fused_attn", None) for m in model.modules()],
        "instance_forwards": ["forward" in m.__dict__ for m in model.modules()],
        "hooks": [len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules()],
        "grads": [p.grad for p in model.parameters()],
    }


def _assert_same(before, after):
    assert before["training"] == after["training"]
    assert before["requires_grad"] == after["requires_grad"]
    assert before["fused"] == after["fused"]
    assert before["instance_forwards"] == after["instance_forwards"]
    assert before["hooks"] == after["hooks"]
    assert all(g is None for g in after["grads"])
    assert all(torch.equal(a, b) for a, b in zip(before["params"], after["params"]))


def test_recording_matches_an_independent_forward(family_model):
    name, model = family_model
    images = _images_for(name)
    record = adapter_for(model).record(images, grads=("attn",))
    logits, attentions, residuals = manual_forward(model, images)
    logits.gather(1, logits.argmax(-1, keepdim=True)).sum().backward()
    torch.testing.assert_close(record.logits, logits.detach(), rtol=1e-5, atol=1e-5)
    for block, attn, residual in zip(record.blocks, attentions, residuals):
        torch.testing.assert_close(block.attn, attn.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(block.grads["attn"], attn.grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(block.residual, residual.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(block.attn,
                                   torch.softmax(block.q @ block.k.transpose(-1, -2) * block.q.shape[-1] ** -0.5, -1),
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(block.output, block.mlp_residual + block.mlp_branch)
    grid = (5, 3) if name == "dynamic" else (4, 4)
    assert record.geometry.grid == grid
    assert record.geometry.num_prefix_tokens == model.num_prefix_tokens
    assert record.blocks[0].attn.shape[-1] == model.num_prefix_tokens + grid[0] * grid[1]


def test_head_projection_splits_the_attention_branch_exactly():
    model = make_vit(init_values=0.3)
    record = adapter_for(model).record(_images_for("vit"))
    block = record.blocks[1]
    per_head = torch.einsum("bhnd,hdc->bhnc", block.attn @ block.v, block.head_projection)
    bias = model.blocks[1].attn.proj.bias * model.blocks[1].ls1.gamma
    torch.testing.assert_close(per_head.sum(1) + bias, block.attn_branch, rtol=1e-5, atol=1e-6)


def test_model_outputs_unchanged_and_state_restored(family_model):
    name, model = family_model
    model.train()  # the user's mode must come back, though explanation runs in eval mode
    model.blocks[0].attn.fused_attn = True
    model.blocks[1].attn.fused_attn = False
    images = _images_for(name)
    before = _snapshot(model)
    with torch.no_grad():
        expected = model.eval()(images)
    model.train()
    for method in ("gae", "rollout"):
        vitexplain.explain(model, images, method)
    _assert_same(before, _snapshot(model))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(images), expected)


def test_state_restored_after_an_exception_inside_the_forward():
    model = make_vit().train()
    before = _snapshot(model)

    def explode(module, args, output):
        raise RuntimeError("injected")

    handle = model.blocks[1].mlp.register_forward_hook(explode)
    before["hooks"] = _snapshot(model)["hooks"]
    with pytest.raises(RuntimeError, match="injected"):
        vitexplain.explain(model, _images_for("vit"), "gae")
    _assert_same(before, _snapshot(model))
    handle.remove()
    with pytest.raises(ValueError, match="outside the model's 10 classes"):
        vitexplain.explain(model, _images_for("vit"), "gae", target=99)
    after = _snapshot(model)
    assert after["training"] == before["training"] and not any(after["instance_forwards"])


def test_fused_and_unfused_attention_give_the_same_maps():
    images = _images_for("vit")
    model = make_vit()
    results = []
    for fused in (True, False):
        for block in model.blocks:
            block.attn.fused_attn = fused
        results.append({m: vitexplain.explain(model, images, m) for m in vitexplain.available_methods()
                        if m in ("raw_attention", "rollout", "attn_gradcam", "gae")})
    for method in results[0]:
        torch.testing.assert_close(results[0][method], results[1][method], rtol=1e-5, atol=1e-6)


def test_each_field_is_kept_in_its_own_blocks_and_queries_alone_keep_the_attention_fused(monkeypatch):
    """GradToken's recording: the lower blocks' attention, the last block's keys and query gradient. The last
    attention stays fused, and what it records equals what the written-out attention records."""
    import torch.nn.functional as F

    from vitexplain.instrumentation import BLOCK_FIELDS, attention

    model, images = make_vit(depth=3), _images_for("vit")
    adapter = adapter_for(model)
    fused_calls = []
    fused = F.scaled_dot_product_attention
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention",
                        lambda *args, **kwargs: fused_calls.append(1) or fused(*args, **kwargs))
    record = adapter.record(images, 4, fields={"attn": (0, 1), "k": (-1,)}, grads={"q": (-1,)})
    kept = [{name for name in BLOCK_FIELDS if getattr(block, name) is not None} for block in record.blocks]
    assert kept == [{"attn"}, {"attn"}, {"k", "q"}] and len(fused_calls) == 1
    written_out = adapter.record(images, 4, fields=("attn", "k"), grads={"q": (-1,)})
    assert len(fused_calls) == 1
    for found, expected in zip(record.blocks, written_out.blocks):
        for name in ("attn", "k"):
            if getattr(found, name) is not None:
                torch.testing.assert_close(getattr(found, name), getattr(expected, name))
    torch.testing.assert_close(record.blocks[-1].grads["q"], written_out.blocks[-1].grads["q"], rtol=1e-5, atol=1e-7)
    assert record.blocks[-1].grads["q"].abs().sum() > 0


def test_logits_on_all_tokens_equal_the_model_and_subsets_equal_a_manual_run():
    model = make_vit(distilled=True)
    adapter = adapter_for(model)
    images = _images_for("vit", batch=2)
    everything = torch.arange(16).expand(2, 1, 16)
    torch.testing.assert_close(adapter.logits_on_tokens(images, everything)[:, 0], adapter.logits(images), rtol=1e-5,
                               atol=1e-5)
    keep = torch.tensor([[[0, 5, 7], [15, 2, 3]], [[1, 1, 4], [9, 10, 11]]])
    got = adapter.logits_on_tokens(images, keep, batch_size=3)
    with torch.no_grad():
        tokens = model._pos_embed(model.patch_embed(images))
        for b in range(2):
            for m in range(2):
                sequence = torch.cat([tokens[b, :2], tokens[b, 2 + keep[b, m]]])[None]
                expected = model.forward_head(model.norm(model.blocks(sequence)))
                torch.testing.assert_close(got[b, m], expected[0], rtol=1e-5, atol=1e-5)


def test_a_call_checks_its_inputs_and_scopes_its_precision_once_and_direct_calls_check_their_own(monkeypatch):
    adapter, images = adapter_for(make_vit()), _images_for("vit", batch=2)
    checks, scopes = [], []
    check, scope = adapter.family.check_inputs, adapter_module.float32_scope
    monkeypatch.setattr(adapter.family, "check_inputs", lambda inputs: checks.append(inputs) or check(inputs))
    monkeypatch.setattr(adapter_module, "float32_scope", lambda model: scopes.append(model) or scope(model))
    for method, options in [("gae", {}), ("tis", dict(n_masks=2, input_space=False)), ("rise", dict(n_masks=2)),
                            ("smoothgrad", dict(n_samples=2)), ("degraded", dict(of="attn_gradcam"))]:
        checks.clear()
        scopes.clear()
        vitexplain.explain(adapter, images, method, **options)  # record, logits, target ... trust explain's call
        assert (len(checks), len(scopes)) == (1, 1), method
    broken = images.clone()
    broken[1, 0, 0, 0] = float("nan")
    keep = torch.zeros(2, 1, 3, dtype=torch.long)
    for direct in (adapter.record, adapter.logits, lambda x: adapter.target(x, None),
                   lambda x: adapter.logits_on_tokens(x, keep)):
        with pytest.raises(ValueError, match=r"NaN or infinite values in the batch's image\(s\) 1 "):
            direct(broken)


def test_models_it_cannot_serve_get_errors_naming_what_is_missing():
    cnn = timm.create_model("resnet18", pretrained=False, num_classes=10)
    with pytest.raises(UnsupportedModelError, match="^method 'rollout' reads attention; ResNet has none"):
        vitexplain.explain(cnn, torch.randn(1, 3, 32, 32), "rollout")
    every_token = make_vit(class_token=False, global_pool="")
    with pytest.raises(UnsupportedModelError, match=r"its head returns every token \(global_pool=''\)"):
        vitexplain.explain(every_token, _images_for("vit"), "rollout")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        vitexplain.explain("vit_base", _images_for("vit"), "rollout")
