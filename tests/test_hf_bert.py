"""BERT-style transformers text classifiers: recording against a written-out post-norm forward, text maps."""
import pytest
import torch
import torch.nn.functional as F
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertTokenizer,
    RobertaConfig,
    RobertaForSequenceClassification,
)

import vitexplain
from vitexplain.instrumentation import (
    BLOCK_FIELDS,
    TokenBatch,
    UnsupportedModelError,
    adapter_for,
    family_of,
)
from vitexplain.instrumentation.families.hf_bert import TransformersText
from vitexplain.registry import available_methods

from test_instrumentation import _assert_same, _snapshot

TEXT_METHODS = available_methods("text")

BERT_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=64, initializer_range=0.2)
WORDS = ["good", "bad", "great", "awful", "movie", "plot", "the", "a", "was", "and", "not", "film", "acting", "boring"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def make_tokenizer(directory, words=WORDS) -> BertTokenizer:
    """A (fast) BERT word-piece tokenizer over the special tokens and ``words``, read from a vocab file it
    writes in ``directory``; nothing downloaded."""
    vocab = directory / "vocab.txt"
    vocab.write_text("\n".join(SPECIAL + list(words)) + "\n")
    return BertTokenizer(vocab=str(vocab))


def make_bert(seed=0, attention="eager", labels=3, vocab_size=len(SPECIAL) + len(WORDS), **overrides):
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=vocab_size, num_labels=labels, attn_implementation=attention,
                        **{**BERT_TINY, **overrides})
    return BertForSequenceClassification(config).eval()


def padded_batch():
    """Two right-padded sequences ([CLS] ... [SEP] [PAD] ...) of 7 and 4 real tokens."""
    ids = torch.tensor([[2, 5, 9, 11, 6, 8, 3], [2, 7, 12, 3, 0, 0, 0]])
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def manual_bert(model, input_ids, attention_mask, keep=None):
    """Independent post-norm BERT forward from the weights; attentions kept in the graph (``retain_grad``).

    ``keep`` [B, K] runs only those positions through the layers (after the embeddings), all attending.
    Returns (logits, per-layer dicts of residual, q, k, v, attn, attn_branch, mlp_input, mlp_branch, output).
    """
    bert = model.bert
    positions = torch.arange(input_ids.shape[1])
    emb = bert.embeddings
    x = (emb.word_embeddings.weight[input_ids] + emb.position_embeddings.weight[positions]
         + emb.token_type_embeddings.weight[0])
    x = emb.LayerNorm(x)
    blocked = (attention_mask == 0)[:, None, None, :] * -1e9
    if keep is not None:
        x = x[torch.arange(x.shape[0])[:, None], keep]
        blocked = torch.zeros(())
    layers = []
    for layer in bert.encoder.layer:
        sa = layer.attention.self
        heads, width = sa.num_attention_heads, sa.attention_head_size
        split = lambda t: t.reshape(t.shape[0], t.shape[1], heads, width).transpose(1, 2)  # noqa: E731
        q, k, v = (split(F.linear(x, lin.weight, lin.bias)) for lin in (sa.query, sa.key, sa.value))
        attn = torch.softmax(q @ k.transpose(-1, -2) / width ** 0.5 + blocked, dim=-1)
        for kept in (q, k, v, attn):
            if kept.requires_grad:
                kept.retain_grad()
        mixed = (attn @ v).transpose(1, 2).reshape(x.shape[0], x.shape[1], heads * width)
        branch = F.linear(mixed, layer.attention.output.dense.weight, layer.attention.output.dense.bias)
        h = layer.attention.output.LayerNorm(x + branch)
        mlp = layer.output.dense(F.gelu(layer.intermediate.dense(h)))
        out = layer.output.LayerNorm(h + mlp)
        layers.append(dict(residual=x, q=q, k=k, v=v, attn=attn, attn_branch=branch, mlp_input=h, mlp_branch=mlp,
                           output=out))
        x = out
    pooled = torch.tanh(bert.pooler.dense(x[:, 0]))
    return model.classifier(pooled), layers


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_recording_matches_a_written_out_post_norm_forward(attention):
    model = make_bert(attention=attention)
    batch = padded_batch()
    adapter = adapter_for(model)
    assert isinstance(adapter.family, TransformersText)
    record = adapter.record(batch, grads=BLOCK_FIELDS)
    logits, layers = manual_bert(model, **batch)
    logits.gather(1, logits.argmax(-1, keepdim=True)).sum().backward()
    torch.testing.assert_close(record.logits, logits.detach(), rtol=1e-5, atol=1e-5)
    geometry = record.geometry
    assert geometry.grid == (7,) and geometry.num_prefix_tokens == 1 and geometry.class_token_index == 0
    real = batch["attention_mask"].bool()
    for block, expected, layer in zip(record.blocks, layers, model.bert.encoder.layer, strict=True):
        for name in ("residual", "attn_branch", "mlp_input", "mlp_branch", "output"):
            torch.testing.assert_close(getattr(block, name), expected[name].detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(block.attn_input, block.residual)
        torch.testing.assert_close(block.mlp_residual, expected["mlp_input"].detach(), rtol=1e-5, atol=1e-5)
        assert (block.attn[:, :, :, ~real[1]][1] == 0).all()  # nothing attends to padding
        for name in ("q", "k", "v", "attn"):
            torch.testing.assert_close(getattr(block, name), expected[name].detach(), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(block.grads[name], expected[name].grad, rtol=1e-4, atol=1e-6)
        per_head = torch.einsum("bhnd,hdc->bnc", block.attn @ block.v, block.head_projection)
        torch.testing.assert_close(per_head + layer.attention.output.dense.bias, block.attn_branch, rtol=1e-5,
                                   atol=1e-5)
        for name in BLOCK_FIELDS:
            assert block.grads[name].shape == getattr(block, name).shape


def test_raw_attention_and_gae_read_the_class_row_per_token():
    model = make_bert()
    batch = padded_batch()
    target = torch.tensor([1, 2])
    logits, layers = manual_bert(model, **batch)
    logits.gather(1, target[:, None]).sum().backward()
    raw = layers[-1]["attn"].detach().mean(1)[:, 0]
    relevance = torch.eye(7).expand(2, 7, 7)
    for layer in layers:
        cam = (layer["attn"].grad * layer["attn"].detach()).clamp(min=0).mean(1)
        relevance = relevance + cam @ relevance
    real = batch["attention_mask"].bool()
    for method, row in (("raw_attention", raw), ("gae", relevance[:, 0])):
        expected = torch.where(real, row, torch.zeros(())).clone()
        expected[:, 0] = 0
        torch.testing.assert_close(vitexplain.explain(model, batch, method, target=target), expected, rtol=1e-4,
                                   atol=1e-7)


@pytest.mark.parametrize("method", TEXT_METHODS)
def test_text_maps_zero_cls_and_padding_and_ignore_the_batch(method):
    model = make_bert()
    batch = padded_batch()
    target = torch.tensor([1, 2])
    maps = vitexplain.explain(model, batch, method, target=target)
    assert maps.shape == (2, 7) and maps.dtype == torch.float32
    assert (maps[:, 0] == 0).all() and (maps[1, 4:] == 0).all()
    assert (maps[:, 1:].abs().sum(1) > 0).all()
    for row, length in ((0, 7), (1, 4)):
        alone = {key: value[row:row + 1, :length] for key, value in batch.items()}
        single = vitexplain.explain(model, alone, method, target=int(target[row]))
        torch.testing.assert_close(maps[row, :length], single[0], rtol=1e-4, atol=1e-7)
    longer = {key: F.pad(value, (0, 5)) for key, value in batch.items()}
    torch.testing.assert_close(vitexplain.explain(model, longer, method, target=target)[:, :7], maps)


def test_sdpa_and_eager_give_the_same_maps():
    batch = padded_batch()
    for method in ("gae", "gradtoken", "tokentm", "attcat"):
        torch.testing.assert_close(vitexplain.explain(make_bert(attention="sdpa"), batch, method),
                                   vitexplain.explain(make_bert(attention="eager"), batch, method), rtol=1e-4,
                                   atol=1e-7)


def test_input_forms_agree(tmp_path):
    model = make_bert()
    tokenizer = make_tokenizer(tmp_path)
    encoding = tokenizer(["the movie was great", "bad plot"], padding=True, return_tensors="pt")
    expected = vitexplain.explain(model, encoding, "gradtoken")
    ids = encoding["input_ids"]
    torch.testing.assert_close(vitexplain.explain(model, ids, "gradtoken"), expected)  # pad tokens are padding
    torch.testing.assert_close(vitexplain.explain(model, dict(encoding), "gradtoken"), expected)
    as_lists = {key: value.tolist() for key, value in encoding.items()}
    torch.testing.assert_close(vitexplain.explain(model, as_lists, "gradtoken"), expected)
    one = vitexplain.explain(model, ids[0], "gradtoken")
    torch.testing.assert_close(one, expected[:1])
    batch = TokenBatch(ids, encoding["attention_mask"].bool(), encoding["token_type_ids"])
    torch.testing.assert_close(vitexplain.explain(model, batch, "gradtoken"), expected)
    predicted = adapter_for(model).logits(encoding).argmax(-1)
    torch.testing.assert_close(vitexplain.explain(model, encoding, "gradtoken", target=predicted), expected)


@pytest.mark.parametrize("bad, error, message", [
    (torch.randn(2, 5), TypeError, "explains tokenised text"),
    ({"attention_mask": torch.ones(1, 3)}, ValueError, "must have 'input_ids'"),
    ({"input_ids": torch.tensor([[2, 3]]), "position_ids": torch.tensor([[0, 1]])}, ValueError, "position_ids"),
    (torch.tensor([[2, 99, 3]]), ValueError, "outside the model's vocabulary of 19"),
    ({"input_ids": torch.tensor([[2, 5, 3]]), "attention_mask": torch.ones(1, 2)}, ValueError,
     "attention_mask must be 0/1"),
    ({"input_ids": torch.tensor([[0, 2, 3]]), "attention_mask": torch.tensor([[0, 1, 1]])}, ValueError, "right-padded"),
    ({"input_ids": torch.tensor([[2, 5, 3]], dtype=torch.float)}, TypeError, "must hold integers"),
])
def test_bad_text_inputs_get_clear_errors(bad, error, message):
    with pytest.raises(error, match=message):
        vitexplain.explain(make_bert(), bad, "gae")


def test_image_methods_and_bad_targets_are_refused_for_text():
    model, batch = make_bert(), padded_batch()
    for method in ("tis", "rise", "integrated_gradients", "tam", "transformer_attribution"):
        with pytest.raises(ValueError, match=f"method '{method}' explains images only; for text use one of: agcam"):
            vitexplain.explain(model, batch, method)
    with pytest.raises(ValueError, match="3 entries for a batch of 2 inputs"):
        vitexplain.explain(model, batch, "gae", target=[0, 1, 2])
    with pytest.raises(ValueError, match="outside the model's 3 classes"):
        vitexplain.explain(model, batch, "gae", target=5)
    with pytest.raises(ValueError, match="'input' gradients"):
        adapter_for(model).record(batch, grads=("input",))


def test_model_left_as_found_and_outputs_unchanged():
    model = make_bert().train()
    model.requires_grad_(False)  # frozen weights: the recording still gets gradients
    batch = padded_batch()
    before = _snapshot(model)
    with torch.no_grad():
        expected = model.eval()(**batch).logits
    model.train()
    for method in TEXT_METHODS:
        assert vitexplain.explain(model, batch, method).abs().sum() > 0
    _assert_same(before, _snapshot(model))

    def explode(module, args, output):
        raise RuntimeError("injected")

    handle = model.bert.encoder.layer[1].output.dense.register_forward_hook(explode)
    before["hooks"] = _snapshot(model)["hooks"]
    with pytest.raises(RuntimeError, match="injected"):
        vitexplain.explain(model, batch, "agcam")
    _assert_same(before, _snapshot(model))
    handle.remove()
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(**batch).logits, expected)


def test_token_subsets_run_through_embed_and_encode():
    model = make_bert()
    adapter = adapter_for(model)
    ids = torch.tensor([[2, 5, 9, 11, 6, 8, 3], [2, 7, 12, 13, 14, 10, 3]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    everything = torch.arange(6).expand(2, 1, 6)
    torch.testing.assert_close(adapter.logits_on_tokens(batch, everything)[:, 0], model(**batch).logits, rtol=1e-5,
                               atol=1e-5)
    keep = torch.tensor([[[0, 2, 5], [4, 1, 3]], [[5, 5, 0], [2, 3, 4]]])
    got = adapter.logits_on_tokens(batch, keep, batch_size=3)
    for m in range(2):
        positions = torch.cat([torch.zeros(2, 1, dtype=torch.long), keep[:, m] + 1], 1)
        with torch.no_grad():
            expected, _ = manual_bert(model, ids, torch.ones_like(ids), keep=positions)
        torch.testing.assert_close(got[:, m], expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unpadded"):
        adapter.family.embed(adapter.check_inputs(padded_batch()))


def test_roberta_shares_the_layout():
    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=40, num_labels=2, pad_token_id=1, **{**BERT_TINY, "max_position_embeddings": 70})
    model = RobertaForSequenceClassification(config).eval()
    ids = torch.tensor([[0, 5, 9, 11, 2], [0, 7, 2, 1, 1]])
    record = adapter_for(model).record(ids, grads=("attn",))
    torch.testing.assert_close(record.logits, model(input_ids=ids, attention_mask=(ids != 1).long()).logits)
    maps = vitexplain.explain(model, ids, "gradtoken")
    assert (maps[:, 0] == 0).all() and (maps[1, 3:] == 0).all() and maps[0].abs().sum() > 0


def test_what_cannot_be_served_gets_a_reason():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=19, **BERT_TINY)
    with pytest.raises(UnsupportedModelError, match="BertForMaskedLM is not a sequence classifier"):
        family_of(BertForMaskedLM(config))
    with pytest.raises(UnsupportedModelError, match="decoder"):
        family_of(make_bert(is_decoder=True))
    with pytest.raises(UnsupportedModelError, match="chunk"):
        family_of(make_bert(chunk_size_feed_forward=2))
    with pytest.raises(UnsupportedModelError, match="patches"):
        family_of(make_bert()).patch_size
