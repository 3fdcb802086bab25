"""Keys stored as SHA-256 hashes with a visible prefix; tokens can be revoked.

Existing keys keep working: each is hashed in place. Going back cannot recover a key from its
hash, so rolling back gives every token a new random key (scripts need a new token).
"""

import hashlib
import secrets

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def keys_hash(apps, schema_editor):
    ApiToken = apps.get_model("accounts", "ApiToken")
    for token in ApiToken.objects.all():
        token.key_hash = hashlib.sha256(token.key.encode("utf-8")).hexdigest()
        token.prefix = token.key[:8]
        token.save(update_fields=["key_hash", "prefix"])


def keys_renew(apps, schema_editor):
    ApiToken = apps.get_model("accounts", "ApiToken")
    for token in ApiToken.objects.all():
        token.key = "ty_" + secrets.token_urlsafe(32)
        token.save(update_fields=["key"])


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="key_hash",
            field=models.CharField(editable=False, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="prefix",
            field=models.CharField(
                default="", editable=False, help_text="the key's first characters", max_length=16
            ),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="apitoken",
            name="key",
            field=models.CharField(max_length=64, null=True),
        ),
        migrations.RunPython(keys_hash, keys_renew),
        migrations.RemoveField(model_name="apitoken", name="key"),
        migrations.AlterField(
            model_name="apitoken",
            name="key_hash",
            field=models.CharField(editable=False, max_length=64, unique=True),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="revoked_at",
            field=models.DateTimeField(blank=True, db_index=True, null=True),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="revoked_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AlterModelOptions(
            name="apitoken",
            options={"ordering": ["-created_at", "-id"], "verbose_name": "API token"},
        ),
    ]
