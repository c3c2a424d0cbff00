"""The --sms streams (a green context's) as CuPy streams: Stream.from_external where CuPy has it
(CuPy 14 deprecates ExternalStream), ExternalStream on older CuPy. Fake CuPy modules, no GPU."""
from types import SimpleNamespace

from jetson_unet.backends.cupy import StreamHandle, external_stream


class Cupy14Stream:
    @classmethod
    def from_external(cls, obj):
        return ("from_external", obj.__cuda_stream__())


def old_external(handle, device_id):
    return ("ExternalStream", handle, device_id)


def test_from_external_gets_the_handle_under_the_stream_protocol():
    cp = SimpleNamespace(cuda=SimpleNamespace(Stream=Cupy14Stream, ExternalStream=old_external))
    assert external_stream(cp, 0x7F00, 0) == ("from_external", (0, 0x7F00))


def test_older_cupy_falls_back_to_external_stream():
    cp = SimpleNamespace(cuda=SimpleNamespace(Stream=object, ExternalStream=old_external))
    assert external_stream(cp, 0x7F00, 1) == ("ExternalStream", 0x7F00, 1)


def test_stream_handle_is_an_int():
    assert StreamHandle(12.0).__cuda_stream__() == (0, 12)
