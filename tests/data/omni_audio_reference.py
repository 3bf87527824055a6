"""qwen-omni-utils' waveform of one audio file, saved as .npy: the reference of
test_media.py::test_audio_file_equals_qwen_omni_utils, run in its own process (see there why;
the import stays under __main__ so that pytest's doctest collection never makes it).

    python omni_audio_reference.py AUDIO OUT.npy
"""
import sys

if __name__ == "__main__":
    import numpy as np
    from qwen_omni_utils import process_audio_info

    conversation = [{"role": "user", "content": [{"type": "audio", "audio": sys.argv[1]}]}]
    (waveform,) = process_audio_info(conversation, use_audio_in_video=False)
    np.save(sys.argv[2], waveform)
