# A language model's launch fields and evaluation figures (issue 36, the dashboard's side).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("experiments", "0020_experiment_resume_requested"),
    ]

    operations = [
        migrations.AddField(
            model_name="experiment",
            name="model_size",
            field=models.CharField(
                blank=True,
                default="",
                help_text="a language model's size preset (byte-llama: smoke, small, ...); blank: "
                "its default",
                max_length=32,
            ),
        ),
        migrations.AddField(
            model_name="experiment",
            name="seq_len",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="bytes a language model reads at once (its training windows); null: "
                "the size's default",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="experiment",
            name="sequence_parallel",
            field=models.BooleanField(
                blank=True,
                help_text="tensor parallel also splits a language model by sequence (default "
                "true); null: not read",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="experiment",
            name="bits_per_byte",
            field=models.FloatField(blank=True, help_text="test loss in bits a byte", null=True),
        ),
        migrations.AddField(
            model_name="experiment",
            name="mfu",
            field=models.FloatField(
                blank=True, help_text="model FLOPs utilisation over the last epoch, 0..1", null=True
            ),
        ),
        migrations.AddField(
            model_name="experiment",
            name="samples",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text="the latest texts a language model wrote at its evaluations: epoch, "
                "step, text",
            ),
        ),
    ]
