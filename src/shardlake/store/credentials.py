"""What to set when a store finds no credentials, per protocol family (for messages)."""

from __future__ import annotations

__all__ = ["credential_hint"]

_CREDENTIAL_HINTS = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass key/secret "
    "in storage_options",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS (or run gcloud auth application-default login), or "
    "pass token in storage_options",
    "az": "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with "
    "AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN, or sign in for DefaultAzureCredential "
    "(az login, managed identity, AZURE_CLIENT_ID...), or pass connection_string / account_name "
    "with account_key, sas_token or credential in storage_options",
}


def credential_hint(protocol: str | None) -> str:
    """What to set for ``protocol``'s credentials (environment variables, storage options)."""
    family = {"s3a": "s3", "gcs": "gs", "abfs": "az", "abfss": "az"}.get(
        protocol or "", protocol or ""
    )
    return _CREDENTIAL_HINTS.get(family, "configure the backend's credentials")
