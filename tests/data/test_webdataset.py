"""WebDataset shards as a data source (mmrl/data/webdataset.py): one shard, a folder of them or a
brace pattern; splits by folder or name; media members through the embedded-media path (decoded,
counted, a corrupt one reported as shard:member); missing media an error; resumable order; and a
tiny run from a folder of shards."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmrl import config
from mmrl.data.inspect import inspect_file
from mmrl.data.media import MediaError, load_media
from mmrl.data.schema import RecordError, load_samples
from mmrl.data.synthetic import GENERATORS
from mmrl.data.synthetic_av import write_mp4, write_wav
from mmrl.train.prompts import PromptSampler


@pytest.fixture(autouse=True)
def embedded(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MMRL_EMBEDDED_DIR", str(tmp_path / "embedded"))
    return tmp_path / "embedded"


def png(colour=(200, 0, 0), size=56) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, "PNG")
    return buf.getvalue()


def shard(path: Path, samples: list[dict]) -> Path:
    """A tar of the samples, each {"__key__": key, ext: bytes | dict (as JSON) | str}, members
    in order, as webdataset's TarWriter writes them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tf:
        for sample in samples:
            key = sample["__key__"]
            for ext, value in sample.items():
                if ext == "__key__":
                    continue
                data = (json.dumps(value).encode() if isinstance(value, dict) else
                        value.encode() if isinstance(value, str) else value)
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


def counting(n: int, first: int = 0, **extra) -> list[dict]:
    return [{"__key__": f"{first + k:06d}", "json": {"prompt": "How many red squares?",
                                                      "solution": str(k % 4), **extra},
             "png": png((50 * (k % 5), 0, 0))} for k in range(n)]


def test_a_single_shard_reads_its_samples_with_their_images(tmp_path, embedded):
    path = shard(tmp_path / "shard-000000.tar", counting(3))
    samples = load_samples(path)
    assert (samples.format, len(samples)) == ("mmrl", 3)
    # Opening reads the tar headers, and the first record (the format rule looks at it).
    assert [p.name.split("-", 1)[1] for p in embedded.iterdir()] == ["000000.png"]
    s = samples[1]
    assert s.source == f"{path}:000001" and s.solution == "1"
    assert len(s.images) == 1 and s.images[0].endswith("-000001.png")
    assert Path(s.images[0]).read_bytes() == png((50, 0, 0))  # the member's bytes, as they are
    assert Path(s.images[0]).parent == embedded
    assert [c["type"] for c in s.messages[0]["content"]] == ["image", "text"]


def test_records_of_other_formats_name_their_members(tmp_path):
    vlm = shard(tmp_path / "vlm.tar", [{"__key__": "a", "json": {
        "image": "a.png", "conversations": [{"from": "human", "value": "<image>Colour?"},
                                            {"from": "gpt", "value": "red"}]}, "png": png()}])
    easy = shard(tmp_path / "easy.tar", [{"__key__": "b", "json": {
        "problem": "<image>Colour?", "answer": "red", "images": ["png"]}, "png": png()}])
    caption = shard(tmp_path / "cap.tar", [{"__key__": "c", "json": {"prompt": "Describe.",
                                                                        "solution": "x"},
                                              "txt": "a red square", "png": png()}])
    video_r1 = shard(tmp_path / "vr1.tar", [{"__key__": "v", "json": {
        "problem_type": "multiple choice", "problem": "Which way?", "options": ["left", "right"],
        "solution": "<answer>B</answer>", "data_type": "video", "path": "mp4"}, "mp4": b"..."}])
    aqa = shard(tmp_path / "aqa.tar", [{"__key__": "w", "json": {
        "audio_path": "wav", "question_text": "Which sound?", "multi_choice": ["dog", "cat"],
        "answer": 1}, "wav": b"..."}])
    for path, fmt, kind, name in ((vlm, "vlm_r1", "images", "-a.png"),
                                  (easy, "easyr1", "images", "-b.png"),
                                  (video_r1, "video_r1", "videos", "-v.mp4"),
                                  (aqa, "r1_aqa", "audios", "-w.wav")):
        samples = load_samples(path)
        assert samples.format == fmt and getattr(samples[0], kind)[0].endswith(name)
    assert load_samples(caption)[0].fields["txt"] == "a red square"  # a text member: a field


def test_a_folder_of_shards_and_a_brace_pattern(tmp_path):
    for k in range(3):
        shard(tmp_path / "wds" / f"shard-{k:06d}.tar", counting(2, first=2 * k))
    folder = load_samples(tmp_path / "wds")
    assert [s.source.rsplit("/", 1)[1] for s in folder] == [
        f"shard-{k // 2:06d}.tar:{k:06d}" for k in range(6)]
    brace = load_samples(f"{tmp_path}/wds/shard-{{000001..000002}}.tar")
    assert [s.id.rsplit(":", 1)[1] for s in brace] == ["000002", "000003", "000004", "000005"]
    assert len(load_samples(f"{tmp_path}/wds/shard-*.tar")) == 6
    with pytest.raises(FileNotFoundError, match=r"1 of 4 shards do not exist \(first: .*"
                                                r"shard-000003.tar\)"):
        load_samples(f"{tmp_path}/wds/shard-{{000000..000003}}.tar")


def test_splits_by_name_and_by_folder(tmp_path):
    shard(tmp_path / "named" / "shard-train-000.tar", counting(3))
    shard(tmp_path / "named" / "shard-val-000.tar", counting(1))
    shard(tmp_path / "dirs" / "train" / "0.tar", counting(2))
    shard(tmp_path / "dirs" / "test" / "0.tar", counting(1))
    assert len(load_samples(tmp_path / "named", default_split="train")) == 3
    assert len(load_samples(f"{tmp_path / 'named'}:validation")) == 1
    assert len(load_samples(f"{tmp_path / 'dirs'}:test")) == 1
    assert len(load_samples(tmp_path / "dirs", default_split="train")) == 2
    with pytest.raises(RecordError, match=r"holds several splits: train \(1 file\), validation"):
        load_samples(tmp_path / "named")


def test_image_video_and_audio_members_decode_and_are_counted(tmp_path):
    mp4, wav = tmp_path / "clip.mp4", tmp_path / "tone.wav"
    frames = np.zeros((8, 56, 56, 3), np.uint8)
    frames[:, :, :28] = 255
    write_mp4(mp4, frames, fps=4)
    write_wav(wav, (0.3 * np.sin(np.arange(16000) / 16000 * 2 * np.pi * 440)).astype(np.float32),
              16000)
    path = shard(tmp_path / "av.tar", [{"__key__": "s0", "json": {
        "prompt": "What do you see and hear?", "solution": "x"}, "jpg": _jpeg(),
        "mp4": mp4.read_bytes(), "wav": wav.read_bytes()}])
    sample = load_samples(path)[0]
    assert [len(sample.images), len(sample.videos), len(sample.audios)] == [1, 1, 1]
    media = load_media(sample, video_kwargs={"nframes": 2})
    assert media["images"][0].size == (64, 48)
    assert media["videos"][0].frames.shape[0] == 2 and media["videos"][0].frames[0, 0, 0, 0] > 200
    assert media["audios"][0].shape == (16000,)
    report = inspect_file(path, deep=True)
    assert report["by_modality"] == {"image+video+audio": 1} and report["bad_media"] == []


def _jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (0, 90, 200)).save(buf, "JPEG")
    return buf.getvalue()


def test_a_corrupt_member_is_a_media_error_naming_shard_and_member(tmp_path):
    samples = counting(2)
    samples[1]["png"] = b"\x89PNG not really"
    path = shard(tmp_path / "shard-000.tar", samples)
    bad = load_samples(path)[1]
    with pytest.raises(MediaError, match=rf"shard-000.tar:000001: cannot decode image "
                                         rf".*-000001.png"):
        load_media(bad)
    report = inspect_file(path)
    assert len(report["bad_media"]) == 1
    assert "shard-000.tar:000001: cannot open image" in report["bad_media"][0]["error"]


def test_missing_or_unnamed_media_is_an_error_never_a_text_only_record(tmp_path):
    named_missing = shard(tmp_path / "a.tar", [{"__key__": "k1", "json": {
        "prompt": "Q", "solution": "1", "images": ["jpg"]}, "png": png()}])
    with pytest.raises(RecordError, match=r"a.tar:k1: 'jpg' names the member k1.jpg, which this "
                                          r"sample does not hold \(it has k1.json, k1.png\)"):
        load_samples(named_missing)
    left_over = shard(tmp_path / "b.tar", [{"__key__": "k2", "json": {
        "prompt": "Q", "solution": "1", "images": ["png"]}, "png": png(), "jpg": _jpeg()}])
    with pytest.raises(RecordError, match=r"b.tar:k2: the media member k2.jpg is named nowhere"):
        load_samples(left_over)
    no_record = shard(tmp_path / "c.tar", [{"__key__": "k3", "png": png()}])
    with pytest.raises(RecordError, match=r"c.tar:k3: no k3.json member"):
        load_samples(no_record)
    report = inspect_file(named_missing)  # inspect names it too, as a record that cannot load
    assert report["records"] == 0 and "names the member k1.jpg" in report["bad_records"][0]


def test_bad_shards_are_named(tmp_path):
    good = shard(tmp_path / "ok.tar", counting(2))
    cut = tmp_path / "cut.tar"
    # Members at 512-byte blocks: 000000.json's header at 0, 000000.png's at 1024, 000001.json's
    # at 2048, 000001.png's at 3072 (data from 3584, 142 bytes).
    cut.write_bytes(good.read_bytes()[:3700])
    with pytest.raises(RecordError, match=r"cut.tar:000001.png: the shard ends inside this mem"):
        load_samples(cut)
    cut.write_bytes(good.read_bytes()[:1200])  # inside a header: tarfile alone sees the end
    with pytest.raises(RecordError, match=r"cut.tar: the shard ends inside a member's header at "
                                          r"byte 1024"):
        load_samples(cut)
    (tmp_path / "text.tar").write_text("not a tar\n" * 100)
    with pytest.raises(RecordError, match=r"text.tar: not a readable tar archive"):
        load_samples(tmp_path / "text.tar")
    gz = tmp_path / "gz.tar.gz"
    gz.write_bytes(b"")
    with pytest.raises(RecordError, match="decompress it"):
        load_samples(gz)


def test_draws_read_only_their_samples_and_resume_in_order(tmp_path, embedded):
    for k in range(2):
        shard(tmp_path / "wds" / f"shard-{k}.tar", counting(10, first=10 * k))
    samples = load_samples(tmp_path / "wds")
    full = PromptSampler(len(samples), seed=3)
    order = [full.next() for _ in range(30)]  # into the second epoch
    first = PromptSampler(len(samples), seed=3)
    drawn = [samples[first.next()].id for _ in range(7)]
    # Only the drawn samples' media were read (and the first record's, to detect the format).
    assert len(list(embedded.iterdir())) == len({*drawn, samples[0].id})
    state = first.state_dict()
    again, resumed = load_samples(tmp_path / "wds"), PromptSampler(len(samples), seed=3)
    resumed.load_state_dict(state)
    rest = [again[resumed.next()].id for _ in range(23)]
    assert drawn + rest == [samples[i].id for i in order]


@pytest.mark.integration
def test_two_steps_train_from_a_folder_of_shards(tmp_path, tiny_config, embedded):
    from mmrl.train.run import train

    GENERATORS.get("counting")(tmp_path / "gen", n_train=8, n_eval=0)
    lines = (tmp_path / "gen" / "train.jsonl").read_text().splitlines()
    samples = [{"__key__": f"{k:06d}", "json": {"task": r["task"], "prompt": r["prompt"],
                                                 "solution": r["solution"]},
                "png": (tmp_path / "gen" / r["images"][0]).read_bytes()}
               for k, r in enumerate(map(json.loads, lines))]
    samples[1]["png"] = b"not an image"
    shard(tmp_path / "wds" / "train" / "shard-000000.tar", samples[:4])
    shard(tmp_path / "wds" / "train" / "shard-000001.tar", samples[4:])
    yaml = tiny_config(tmp_path / "tiny.yaml", tmp_path / "gen")
    cfg = config.load(yaml, [f"log.run_dir={tmp_path / 'run'}", f"data.train={tmp_path / 'wds'}",
                             "data.generate=null", "data.shuffle=false", "data.on_bad_sample=skip",
                             "log.rollouts_every=1"])
    summary = train(cfg)
    assert summary["skipped_records"]["count"] == 1
    assert "shard-000000.tar:000001: cannot decode image" in summary["skipped_records"]["first"][0]
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").open()]
    assert rollouts and all(len(r["images"]) == 1 and Path(r["images"][0]).parent == embedded
                            for r in rollouts)
    assert {Path(r["images"][0]).name.rsplit("-", 1)[1] for r in rollouts} == {
        "000000.png", "000002.png", "000003.png", "000004.png"}


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_the_header_reader_agrees_with_tarfile(tmp_path, fmt):
    """Pax records (webdataset's TarWriter: a float mtime gives every member one), GNU long
    names and ustar prefixes: the fast header reader finds what tarfile finds."""
    from mmrl.data.webdataset import ShardTable, _tarfile_members

    path = tmp_path / "f.tar"
    names = [f"d/{'x' * 120}/k1.json", f"d/{'x' * 120}/k1.png", "k2.json", "k2.jpg"]
    names += ["k\u00e9.json"] if fmt != tarfile.USTAR_FORMAT else []
    with tarfile.open(path, "w", format=fmt) as tf:
        for k, name in enumerate(names):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = 300 * k, 1.7e9 + 0.25
            tf.addfile(info, io.BytesIO(b"x" * info.size))
    table = ShardTable([path])
    found = [(f"{table.keys[i]}.{ext}", *at) for i in range(len(table))
             for ext, at in table.members(i).items()]
    assert found == _tarfile_members(path) and [f[0] for f in found] == names


def test_convert_writes_a_shards_media_beside_its_output(tmp_path, monkeypatch):
    from mmrl.data.formats import convert

    path = shard(tmp_path / "in" / "shard-0.tar", counting(2))
    monkeypatch.chdir(tmp_path)  # a relative output, as typed on a command line
    assert convert(None, path, "out/train.jsonl")["records"] == 2
    record = json.loads((tmp_path / "out" / "train.jsonl").read_text().splitlines()[1])
    assert record["images"] == [f"train_media/{Path(record['images'][0]).name}"]
    assert (tmp_path / "out" / record["images"][0]).read_bytes() == png((50, 0, 0))


def test_mmrl_data_inspect_reads_shards(tmp_path, capsys):
    from mmrl import cli

    shard(tmp_path / "wds" / "shard-train-000.tar", counting(3))
    shard(tmp_path / "wds" / "shard-val-000.tar", counting(2))
    assert cli.main(["data", "inspect", f"{tmp_path}/wds:validation", "--show", "0"]) == 0
    text = capsys.readouterr().out
    assert "(format mmrl): 2 records" in text and "by modality: image=2" in text
    assert "media that fail to open: 0" in text
    assert cli.main(["data", "inspect", f"{tmp_path}/wds/shard-{{train,val}}-000.tar"]) == 0
    assert "(format mmrl): 5 records" in capsys.readouterr().out
    cli.main(["data", "inspect", f"{tmp_path}/wds"])
    assert "holds several splits: train (1 file), validation (1 file)" in capsys.readouterr().out
