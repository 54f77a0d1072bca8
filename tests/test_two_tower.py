"""Text prompts on two-tower models (transformers' CLIP and SigLIP): the image tower's family, text targets,
``explain_texts`` and ``vitexplain explain --text``.

Tiny random models built from configs, a CLIP tokenizer built from a vocabulary written here (nothing
downloaded). References are the models' own forwards: ``logits_per_image`` (CLIP: logit_scale·cos; SigLIP:
logit_scale·cos + logit_bias), its gradient by plain autograd, and the attention transformers returns.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

import vitexplain  # noqa: E402
from vitexplain.instrumentation import adapter_for  # noqa: E402

from cli import run_cli  # noqa: E402

TEXTS = ["a dog", "a cat", "a cat sat"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
MERGES = [("d", "o"), ("do", "g</w>"), ("c", "a"), ("ca", "t</w>")]
VISION = dict(image_size=32, patch_size=8, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=3)


def tokenizer():
    """A CLIP byte-level BPE tokenizer over lower-case letters and four merges."""
    vocab = {letter: i for i, letter in enumerate(LETTERS)}
    vocab.update({letter + "</w>": len(LETTERS) + i for i, letter in enumerate(LETTERS)})
    for pair in MERGES:
        vocab["".join(pair)] = len(vocab)
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    return transformers.CLIPTokenizer(vocab=vocab, merges=MERGES)


def two_tower(kind: str, seed: int = 0):
    """A tiny CLIPModel or SiglipModel, every LayerNorm's gain and bias drawn off (1, 0) so a left-out norm shows."""
    tok = tokenizer()
    text = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=16, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    if kind == "clip":
        config = transformers.CLIPConfig(text_config=text, vision_config=VISION, projection_dim=24)
        model = transformers.CLIPModel(config)
    else:
        config = transformers.SiglipConfig(text_config=dict(text, projection_size=48), vision_config=VISION)
        model = transformers.SiglipModel(config)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(1, 0.2)
                module.bias.normal_(0, 0.2)
    return model.eval(), tok


def images(batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def model_similarity(model, tok, kind: str, pixels: torch.Tensor, texts: list[str]) -> torch.Tensor:
    """cos(image b, text t) [B, T] from the model's own forward: logits_per_image with its scale (and bias) taken off,
    the texts tokenised as each model's processor does (CLIP: padded to the longest, masked; SigLIP: to full length)."""
    if kind == "clip":
        tokens = tok(texts, padding=True, return_tensors="pt")
        logits = model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"],
                       pixel_values=pixels).logits_per_image
        return logits / model.logit_scale.exp()
    tokens = tok(texts, padding="max_length", max_length=16, return_tensors="pt")
    logits = model(input_ids=tokens["input_ids"], pixel_values=pixels).logits_per_image
    return (logits - model.logit_bias) / model.logit_scale.exp()


@pytest.fixture(scope="module", params=["clip", "siglip"])
def saved(request, tmp_path_factory):
    """(kind, model loaded from its save_pretrained folder with the tokenizer beside it, tokenizer, folder)."""
    model, tok = two_tower(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    loaded = type(model).from_pretrained(folder, attn_implementation="eager").eval()
    return request.param, loaded, tok, folder


def test_a_folder_loads_with_its_processors_preprocessing(saved):
    from vitexplain.models import load_model

    kind, model, _, folder = saved
    loaded, config = load_model(str(folder), device="cpu")
    assert type(loaded) is type(model) and not loaded.training
    assert config["input_size"] == (3, 32, 32)
    assert config["mean"] == ((0.5,) * 3 if kind == "siglip" else (0.48145466, 0.4578275, 0.40821073))
    assert config["crop_mode"] == ("squash" if kind == "siglip" else "center")


def test_text_target_scores_the_models_image_text_similarity(saved):
    kind, model, tok, _ = saved
    pixels = images(2)
    directions = vitexplain.text_embeddings(model, TEXTS, tok)  # [T, D]
    pairs, targets = pixels.repeat_interleave(len(TEXTS), 0), directions.repeat(2, 1)
    record = adapter_for(model).record(pairs, targets, fields=())
    with torch.no_grad():
        expected = model_similarity(model, tok, kind, pixels, TEXTS)
    torch.testing.assert_close(record.scores, expected.flatten(), atol=1e-5, rtol=1e-5)
    assert expected.std() > 0.01  # the texts and images are told apart


def test_input_gradient_is_that_of_the_models_similarity(saved):
    """SmoothGrad with one noiseless sample is the input gradient of the score: here of the model's own cosine."""
    kind, model, tok, _ = saved
    pixels = images(2).requires_grad_(True)
    model_similarity(model, tok, kind, pixels, ["a dog"])[:, 0].sum().backward()
    maps = vitexplain.explain(model, pixels.detach(), "smoothgrad", target="a dog", n_samples=1, stdev=0.0,
                              absolute=False)
    torch.testing.assert_close(maps, pixels.grad.sum(1), atol=1e-5, rtol=1e-4)


def test_recorded_attention_is_the_models(saved):
    kind, model, _, _ = saved
    pixels = images(2)
    direction = torch.randn(model.config.projection_dim if kind == "clip" else 48)
    record = adapter_for(model).record(pixels, direction, fields=("attn",))
    with torch.no_grad():
        own = model.vision_model(pixel_values=pixels, output_attentions=True, output_hidden_states=True)
    for block, attention in zip(record.blocks, own.attentions):
        torch.testing.assert_close(block.attn, attention, atol=1e-6, rtol=1e-5)
    if kind == "siglip":  # the readout: the pooling head's one query over the normed last tokens, mean of its heads
        head = model.vision_model.head
        with torch.no_grad():
            _, weights = head.attention(head.probe.expand(2, -1, -1), own.last_hidden_state, own.last_hidden_state)
        torch.testing.assert_close(record.geometry.readout.weights, weights[:, 0], atol=1e-6, rtol=1e-5)


def test_explain_texts_is_every_text_on_every_image(saved):
    kind, model, tok, _ = saved
    pixels = images(2)
    maps = vitexplain.explain_texts(model, pixels, TEXTS, "gae", tokenizer=tok)
    assert maps.shape == (2, len(TEXTS), 4, 4)
    directions = vitexplain.text_embeddings(model, TEXTS, tok)
    for t, text in enumerate(TEXTS):
        alone = vitexplain.explain(model, pixels[1:], "gae", target=text)  # the saved tokenizer, read from the folder
        torch.testing.assert_close(maps[1, t], alone[0], atol=1e-6, rtol=1e-5)
        per_image = vitexplain.explain(model, pixels, "gae",
                                       target=lambda out, d=directions[t]: F.cosine_similarity(out, d[None]))
        torch.testing.assert_close(maps[:, t], per_image, atol=1e-6, rtol=1e-5)
    assert (maps[:, 0] - maps[:, 1]).abs().max() > 1e-5  # another text, another map (random weights: close ones)
    one_each = vitexplain.explain(model, pixels, "gae", target=TEXTS[:2])  # one text per image
    torch.testing.assert_close(one_each, torch.stack([maps[0, 0], maps[1, 1]]), atol=1e-6, rtol=1e-5)


def test_clip_vision_tower_with_projection_is_served():
    clip, _ = two_tower("clip")  # SDPA attention, transformers' default
    config = transformers.CLIPVisionConfig(**VISION, projection_dim=24)
    tower = transformers.CLIPVisionModelWithProjection(config).eval()
    tower.load_state_dict({key: value for key, value in clip.state_dict().items()
                           if key.startswith(("vision_model.", "visual_projection."))})
    pixels = images(2)
    direction = torch.randn(24)
    with torch.no_grad():
        expected = F.cosine_similarity(clip.get_image_features(pixel_values=pixels).pooler_output, direction[None])
    torch.testing.assert_close(adapter_for(tower).record(pixels, direction, fields=()).scores, expected, atol=1e-5,
                               rtol=1e-5)
    torch.testing.assert_close(vitexplain.explain(tower, pixels, "legrad", target=direction),
                               vitexplain.explain(clip, pixels, "legrad", target=direction), atol=1e-6, rtol=1e-5)


def test_text_targets_refused_clearly():
    clip, tok = two_tower("clip")
    pixels = images(2)
    with pytest.raises(ValueError, match="got 3 texts for 2 images"):
        vitexplain.explain(clip, pixels, "gae", target=TEXTS)
    with pytest.raises(ValueError, match="not loaded from a local folder"):
        vitexplain.explain(clip, pixels, "gae", target="a dog")
    with pytest.raises(ValueError, match="explains classes only"):
        vitexplain.explain_texts(clip, pixels, ["a dog"], "lrp", tokenizer=tok)
    tower = transformers.CLIPVisionModelWithProjection(transformers.CLIPVisionConfig(**VISION, projection_dim=24))
    with pytest.raises(TypeError, match="needs a two-tower model with its text tower"):
        vitexplain.explain(tower, pixels, "gae", target="a dog")
    clip.train()
    flags = [module.training for module in clip.modules()]
    vitexplain.explain_texts(clip, pixels, ["a dog"], "gae", tokenizer=tok)
    assert [module.training for module in clip.modules()] == flags


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    model, tok = two_tower("clip")
    folder = tmp_path_factory.mktemp("clip_cli")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_cli_explains_each_text(clip_folder, tmp_path):
    from PIL import Image

    from vitexplain.image_files import load_image, make_transform
    from vitexplain.models import load_model

    picture = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(picture)
    done = run_cli("explain", str(picture), "--model", str(clip_folder), "--method", "gae", "--text", "a dog",
                    "--text", "A cat!", "--device", "cpu", "-o", str(tmp_path / "out"), "--no-progress", "--html",
                    cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "out" / "explorer.html").read_text()
    assert "photo.png: a dog" in page and "photo.png: A cat!" in page
    loaded, config = load_model(str(clip_folder), device="cpu")
    batch = make_transform(config)(load_image(str(picture)))[None]
    expected = vitexplain.explain_texts(loaded, batch, ["a dog", "A cat!"], "gae")
    for t, slug in enumerate(["a_dog", "a_cat"]):
        saved_map = np.load(tmp_path / "out" / f"photo.{slug}.gae.npy")
        np.testing.assert_allclose(saved_map, expected[0, t].numpy(), atol=1e-5, rtol=1e-4)
        assert (tmp_path / "out" / f"photo.{slug}.gae.png").is_file()
    cosines = [float(line.rsplit("cosine ", 1)[1].rstrip(")")) for line in done.stdout.splitlines() if "cosine" in line]
    with torch.no_grad():
        own = F.cosine_similarity(adapter_for(loaded).forward(batch),
                                  vitexplain.text_embeddings(loaded, ["a dog", "A cat!"]))
    np.testing.assert_allclose(cosines, own.numpy(), atol=1e-3)


def test_cli_refuses_before_reading_images(clip_folder, tmp_path, capsys):
    from vitexplain.cli.main import main

    missing = str(tmp_path / "absent.png")
    out = tmp_path / "out"
    no_text = run_cli("explain", missing, "--model", str(clip_folder), "--method", "gae", "-o", str(out), cwd=tmp_path)
    assert no_text.returncode == 2 and "give --text" in no_text.stderr
    # the other refusals in this process (each subprocess costs seconds of imports)
    assert main(["explain", missing, "--model", str(clip_folder), "--method", "gae", "--text", "a dog", "--target", "1",
                 "--device", "cpu", "-o", str(out)]) == 2
    assert "exclusive" in capsys.readouterr().err
    assert main(["explain", missing, "--model", str(clip_folder), "--method", "gae,lrp", "--text", "a dog",
                 "--device", "cpu", "-o", str(out)]) == 2
    assert "method lrp explains classes only" in capsys.readouterr().err
    assert main(["explain", missing, "--model", "digits_vit", "--method", "gae", "--text", "a dog", "--device", "cpu",
                 "-o", str(out)]) == 2
    assert "two-tower model" in capsys.readouterr().err
    assert not out.exists()
