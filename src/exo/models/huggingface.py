"""Download a Hugging Face repository into the models directory, mapping hub failures to our errors."""

import logging
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from exo.models.errors import ModelLoadError, ModelNotFoundError
from exo.models.staging import staged_directory

logger = logging.getLogger(__name__)


def download_repository(repo_id: str, target: Path) -> Path:
    """Fetch every file of `repo_id` into `target` (atomically) with huggingface_hub's progress bars."""
    logger.info("downloading %s from Hugging Face into %s", repo_id, target)
    with staged_directory(target) as staging:
        try:
            snapshot_download(repo_id, local_dir=staging)
        except GatedRepoError as error:
            raise ModelLoadError(
                f"cannot download {repo_id}: the repository is gated (log in and accept its terms)"
            ) from error
        except (RepositoryNotFoundError, RevisionNotFoundError) as error:
            raise ModelNotFoundError(f"cannot download {repo_id}: no such repository on Hugging Face") from error
        except LocalEntryNotFoundError as error:
            # Raised by huggingface_hub when the hub cannot be reached and nothing is cached.
            raise ModelLoadError(f"cannot download {repo_id}: no network / hub unreachable") from error
        except (HfHubHTTPError, OSError) as error:
            raise ModelLoadError(f"cannot download {repo_id}: {error}") from error
        if not (staging / "config.json").is_file():
            raise ModelLoadError(f"cannot use {repo_id}: the repository has no config.json (not an mlx-lm model)")
    return target
