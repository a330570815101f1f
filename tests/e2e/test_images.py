"""Image embeddings served end to end: Ivy (decoding and preparing each
image in Rust, the model's own tokenizer for text) in front of a real
Tulip on seeded CLIP and SigLIP models, against transformers on the same
weights and the same image bytes (its PIL image processor and
``get_image_features`` / ``get_text_features``): image rows, text rows and
the text-image similarity matrix at cosine >= 0.999. Then the refusals:
each one in its API family's shape, and nothing else disturbed."""

from __future__ import annotations

import base64
import http.server
import io
import json
import struct
import threading
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.harness.tiny_models import tiny_dual_encoder
from tests.support.servers import Ivy, Tulip

pytestmark = pytest.mark.slow

TEXTS = ["a photo of a cat", "Der Mont Blanc ist der höchste Berg der Alpen.", "a"]


def _image(kind: str, size: tuple[int, int], seed: int) -> bytes:
    """A photo-like image (smooth gradients and noise) encoded as `kind`."""
    from PIL import Image

    w, h = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (w + h)], axis=-1)
    pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    out = io.BytesIO()
    if kind == "JPEG":
        image.save(out, kind, quality=90)
    elif kind == "GIF":
        image.convert("P").save(out, kind)
    elif kind == "RGBA-PNG":
        rgba = image.convert("RGBA")
        rgba.putalpha(Image.fromarray((x * 255 // w).astype(np.uint8)))
        rgba.save(out, "PNG")
    else:
        image.save(out, kind)
    return out.getvalue()


IMAGES = {
    "jpeg": _image("JPEG", (64, 48), 0),
    "png": _image("PNG", (40, 56), 1),
    "webp": _image("WEBP", (50, 50), 2),
    "gif": _image("GIF", (33, 47), 3),
    "png-alpha": _image("RGBA-PNG", (48, 40), 4),
}


def _rotated_jpeg() -> bytes:
    """A JPEG whose EXIF says 'rotate 90 degrees clockwise' (orientation 6)."""
    from PIL import Image

    image = Image.open(io.BytesIO(_image("JPEG", (60, 30), 5)))
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90, exif=exif.tobytes())
    return out.getvalue()


IMAGES["jpeg-exif6"] = _rotated_jpeg()


def data_uri(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def _bomb() -> bytes:
    """A valid PNG header declaring 100,000 x 100,000 pixels, then a tiny
    deflate stream: a decompression bomb's shape without its size."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def _stack(model_dir, log_dir):
    tulip = Tulip(str(model_dir), log_dir=log_dir, threads=1)
    try:
        ivy = Ivy([tulip.url], False, log_dir=log_dir, max_image_pixels=4_000_000)
    except BaseException:
        tulip.stop()
        raise
    return tulip, ivy


@pytest.fixture(scope="module")
def clip(tmp_path_factory, log_dir):
    d = tiny_dual_encoder(tmp_path_factory.mktemp("clip") / "m", seed=0, served=True)
    tulip, ivy = _stack(d, log_dir)
    yield d, tulip, ivy
    ivy.stop()
    tulip.stop()


@pytest.fixture(scope="module")
def siglip(tmp_path_factory, log_dir):
    d = tiny_dual_encoder(tmp_path_factory.mktemp("siglip") / "m", seed=2, family="siglip", served=True)
    tulip, ivy = _stack(d, log_dir)
    yield d, tulip, ivy
    ivy.stop()
    tulip.stop()


def reference(model_dir, texts: list[str], images: list[bytes], pad_to: int = 0):
    """transformers on the same weights: its PIL processor on the same
    bytes (opened with their EXIF orientation applied, as Ivy does; the
    processor composites alpha onto white), the served tokenizer's ids
    (padded as SigLIP's processor pads)."""
    from PIL import Image, ImageOps
    from tokenizers import Tokenizer
    from transformers import AutoImageProcessor, AutoModel

    model = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    processor = AutoImageProcessor.from_pretrained(str(model_dir), backend="pil")
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    feats = lambda out: out if isinstance(out, torch.Tensor) else out.pooler_output  # noqa: E731
    with torch.inference_mode():
        pixels = processor(images=[ImageOps.exif_transpose(Image.open(io.BytesIO(b))) for b in images],
                           return_tensors="pt")["pixel_values"]
        img = F.normalize(feats(model.get_image_features(pixel_values=pixels)), dim=-1)
        rows = []
        for t in texts:
            ids = tok.encode(t).ids[:model.config.text_config.max_position_embeddings]
            if pad_to:
                ids = ids + [model.config.text_config.pad_token_id] * (pad_to - len(ids))
            rows.append(feats(model.get_text_features(input_ids=torch.tensor([ids]))))
        txt = F.normalize(torch.cat(rows), dim=-1)
    return txt, img


def vectors(body) -> torch.Tensor:
    return torch.tensor(np.array([d["embedding"] for d in body["data"]], dtype=np.float32))


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    cos = F.cosine_similarity(got.double(), want.double())
    assert cos.min() >= 0.999, cos


def test_clip_images_and_texts_match_transformers(clip):
    model_dir, _, ivy = clip
    names = list(IMAGES)
    # Mixed in one request, as Jina's API takes them: strings, {"text"}, {"image"}.
    payload = [TEXTS[0], {"image": data_uri(IMAGES[names[0]], "image/jpeg")}, {"text": TEXTS[1]}]
    payload += [{"image": base64.b64encode(IMAGES[n]).decode()} for n in names[1:]] + [TEXTS[2]]
    status, body = ivy.post_json("/v1/embeddings", {"input": payload})
    assert status == 200, body
    got = vectors(body)
    assert [d["index"] for d in body["data"]] == list(range(len(payload)))
    is_image = [not isinstance(p, str) and "image" in p for p in payload]
    want_txt, want_img = reference(model_dir, TEXTS, [IMAGES[n] for n in names])
    got_img, got_txt = got[torch.tensor(is_image)], got[~torch.tensor(is_image)]
    close(got_img, want_img)
    close(got_txt, want_txt)
    # The text-image similarity matrix, what a search ranks by.
    assert torch.allclose(got_txt @ got_img.T, want_txt @ want_img.T, atol=2e-3)
    # An image embedded alone equals the same image in the batch (the EXIF one).
    status, alone = ivy.post_json("/v1/embeddings", {"input": [{"image": data_uri(IMAGES["jpeg-exif6"])}]})
    assert status == 200, alone
    close(vectors(alone), got_img[names.index("jpeg-exif6")][None])


def test_cohere_images_and_inputs_give_the_same_vectors(clip):
    _, _, ivy = clip
    uris = [data_uri(IMAGES["png"]), data_uri(IMAGES["jpeg"], "image/jpeg")]
    status, openai = ivy.post_json("/v1/embeddings", {"input": [{"image": u} for u in uris] + [TEXTS[0]],
                                                      "dimensions": 16})
    assert status == 200, openai
    want = vectors(openai)
    status, by_images = ivy.post_json("/v2/embed", {"images": uris, "input_type": "image", "output_dimension": 16,
                                                    "embedding_types": ["float", "int8"]})
    assert status == 200, by_images
    close(torch.tensor(by_images["embeddings"]["float"]), want[:2])
    assert len(by_images["embeddings"]["int8"]) == 2
    inputs = [{"content": [{"type": "image_url", "image_url": {"url": u}}]} for u in uris]
    inputs.append({"content": [{"type": "text", "text": TEXTS[0]}]})
    status, by_inputs = ivy.post_json("/v2/embed", {"inputs": inputs, "input_type": "search_document",
                                                    "output_dimension": 16})
    assert status == 200, by_inputs
    close(torch.tensor(by_inputs["embeddings"]["float"]), want)
    assert by_inputs["texts"] == [TEXTS[0]]


def test_siglip_pads_text_and_matches_transformers(siglip):
    model_dir, tulip, ivy = siglip
    images = [IMAGES["png"], IMAGES["webp"]]
    status, body = ivy.post_json("/v1/embeddings", {"input": TEXTS + [{"image": data_uri(b)} for b in images]})
    assert status == 200, body
    got = vectors(body)
    want_txt, want_img = reference(model_dir, TEXTS, images, pad_to=16)
    close(got[:3], want_txt)
    close(got[3:], want_img)
    # Tulip refuses unpadded SigLIP text from a caller that skips Ivy.
    import grpc

    from tulip.client import TulipClient

    with TulipClient(tulip.target) as c:
        info = c.info()
        assert (info.text_pad_to, info.pad_token_id, info.image_tokens) == (16, 0, 9)
        with pytest.raises(grpc.RpcError) as e:
            c.embed([[101, 2000, 102]])
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "padded to exactly 16" in e.value.details()
        # Pixels that are not whole images, or not finite, never reach the model.
        wrong = c.pb2.EmbedRequest(pixels=b"\0" * 12, images=1, kind=1)
        with pytest.raises(grpc.RpcError) as e:
            c.stub.Embed(wrong, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "bytes of pixels" in e.value.details()
        nan = np.zeros(3 * 48 * 48, dtype="<f4")
        nan[5000] = np.nan
        with pytest.raises(grpc.RpcError) as e:
            c.stub.Embed(c.pb2.EmbedRequest(pixels=nan.tobytes(), images=1, kind=1), timeout=30)
        assert "not finite" in e.value.details()


BAD = [
    # (what, input item, OpenAI status, words in the message)
    ("corrupt", {"image": data_uri(IMAGES["png"][:60])}, 422, "could not be decoded"),
    ("bomb", {"image": data_uri(_bomb())}, 413, "limit is 4000000 pixels"),
    ("not an image", {"image": data_uri(b"plain text, not pixels", "text/plain")}, 415, "text/plain"),
    ("unknown format", {"image": base64.b64encode(b"BM" + b"\0" * 64).decode()}, 415, "JPEG, PNG, WebP or GIF"),
    ("url", {"image": "https://example.com/cat.png"}, 422, "fetches no images (--image-url-hosts is empty)"),
    ("not base64", {"image": "data:image/png;base64,@@@"}, 422, "not valid base64"),
    ("two keys", {"image": data_uri(IMAGES["png"]), "text": "x"}, 422, "one key"),
]


@pytest.mark.parametrize("what,item,status,words", BAD, ids=[b[0] for b in BAD])
def test_bad_images_are_refused_in_the_api_shape(clip, what, item, status, words):
    _, _, ivy = clip
    got, body = ivy.post_json("/v1/embeddings", {"input": ["fine text", item]})
    assert got == status, body
    assert words in body["error"]["message"], body
    assert body["error"]["type"] == "invalid_request_error"
    # Cohere's shape for the same image.
    if "image" in item and len(item) == 1:
        got, body = ivy.post_json("/v2/embed", {"images": [item["image"]], "input_type": "image"})
        assert got == status and words in body["message"], body


def test_refusals_leave_the_service_whole(clip, ivy_minilm):
    _, tulip, ivy = clip
    # /info says what an image is here, and that a text model takes none.
    assert json.loads(ivy.get("/info")[1])["images"] == {"height": 32, "width": 32, "tokens": 17}
    assert json.loads(ivy_minilm.get("/info")[1])["images"] is None
    status, body = ivy.post_json("/v1/embeddings", {"input": [{"image": data_uri(IMAGES["gif"])}]})
    assert status == 200 and len(body["data"]) == 1
    assert tulip.proc.poll() is None
    # A text-only model says so, in OpenAI's shape.
    status, body = ivy_minilm.post_json("/v1/embeddings", {"input": [{"image": data_uri(IMAGES["png"])}]})
    assert status == 422 and "takes text only" in body["error"]["message"], body
    # Several content items in one Cohere input: refused, naming the input.
    both = {"content": [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": data_uri(IMAGES["png"])}}]}
    status, body = ivy.post_json("/v2/embed", {"inputs": [both], "input_type": "search_document"})
    assert status == 422 and "inputs[0].content has 2 items" in body["message"], body


class _Images(http.server.BaseHTTPRequestHandler):
    """Serves IMAGES by name, a redirect, and a large body."""

    def do_GET(self):  # noqa: N802 (the standard library's name)
        name = self.path.strip("/")
        if name == "moved":
            self.send_response(302)
            self.send_header("Location", "/png")
            self.end_headers()
            return
        body = b"\xff" * 100_000 if name == "big" else IMAGES.get(name)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_host():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"{server.server_address[0]}:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_urls_only_from_listed_hosts_bounded_and_without_redirects(clip, image_host, log_dir):
    _, tulip, plain = clip
    port = image_host.split(":")[1]
    ivy = Ivy([tulip.url], False, log_dir=log_dir, image_url_hosts="127.0.0.1,localhost", max_image_bytes=50_000,
              image_url_timeout=5)
    try:
        status, body = ivy.post_json("/v1/embeddings", {"input": [{"image": f"http://{image_host}/png"}]})
        assert status == 200, body
        status, want = plain.post_json("/v1/embeddings", {"input": [{"image": data_uri(IMAGES["png"])}]})
        close(vectors(body), vectors(want))
        for url, code, words in [
            (f"http://localhost:{port}/png", 422, "resolves to 127.0.0.1, a private address"),
            (f"http://127.0.0.2:{port}/png", 422, "host 127.0.0.2 is not in --image-url-hosts"),
            (f"http://{image_host}/moved", 422, "redirects are not followed"),
            (f"http://{image_host}/missing", 422, "answered 404"),
            (f"http://{image_host}/big", 413, "is over 50000 bytes"),
            (f"ftp://{image_host}/png", 422, "is not valid base64"),
        ]:
            status, body = ivy.post_json("/v1/embeddings", {"input": ["text", {"image": url}]})
            assert status == code and words in body["error"]["message"], (url, body)
    finally:
        ivy.stop()


def test_grpc_embeds_images_after_the_inputs(clip):
    import grpc

    from tulip.client import load_stubs

    _, _, ivy = clip
    pb2, pb2_grpc = load_stubs("ivy")
    status, want = ivy.post_json("/v1/embeddings", {"input": [TEXTS[0], {"image": data_uri(IMAGES["webp"])}]})
    assert status == 200, want
    with grpc.insecure_channel(ivy.grpc_target) as channel:
        stub = pb2_grpc.IvyStub(channel)
        reply = stub.Embed(pb2.EmbedRequest(inputs=[TEXTS[0]], images=[IMAGES["webp"]]), timeout=30)
        got = np.frombuffer(reply.data, dtype="<f4").reshape(reply.rows, reply.dim)
        close(torch.tensor(got.copy()), vectors(want))
        with pytest.raises(grpc.RpcError) as e:
            stub.Embed(pb2.EmbedRequest(images=[IMAGES["png"][:60]]), timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "images[0]" in e.value.details()
