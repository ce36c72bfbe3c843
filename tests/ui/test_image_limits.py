"""Image limits are defined once (``engine.limits``) and every layer reads them; together they let an image the
page accepted reach the model unchanged."""
from PIL import Image

from engine import limits
from engine.config import EngineConfig
from ui.config import UIConfig
from ui.uploads.image_check import UploadLimits, check_image
from worker.config import Settings


def test_every_layer_takes_its_image_defaults_from_engine_limits():
    page, worker, engine = UIConfig(), Settings(), EngineConfig(model="any")
    assert (page.max_upload_bytes, page.max_image_pixels, page.max_image_side, page.allowed_formats) == (
        limits.UPLOAD_MAX_BYTES, limits.DECODE_MAX_PIXELS, limits.MAX_SIDE, limits.ALLOWED_FORMATS)
    assert (worker.image_max_bytes, worker.image_max_side) == (limits.UPLOAD_MAX_BYTES, limits.MAX_SIDE)
    assert engine.max_image_pixels == limits.MODEL_MAX_PIXELS


def test_an_image_the_page_accepted_is_not_downscaled_again_by_the_engine():
    import io

    buf = io.BytesIO()
    Image.new("RGB", (3000, 2000), (10, 200, 30)).save(buf, format="PNG")
    checked = check_image(buf.getvalue(), UploadLimits.from_config(UIConfig()))
    assert checked.downscaled and max(checked.width, checked.height) == limits.MAX_SIDE
    assert checked.width * checked.height <= EngineConfig(model="any").max_image_pixels
