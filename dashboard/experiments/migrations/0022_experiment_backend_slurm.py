# Slurm as an execution backend (issue 37): where a run runs, what its job asks for, and the
# scheduler's side of it, mirrored by polling.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("experiments", "0021_experiment_language_model"),
    ]

    operations = [
        migrations.AddField(
            model_name="experiment",
            name="backend",
            field=models.CharField(
                choices=[("celery", "Celery workers"), ("slurm", "Slurm")],
                default="celery",
                help_text="celery (Trainyard's workers) or slurm (one batch job per run)",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="experiment",
            name="partition",
            field=models.CharField(
                blank=True,
                help_text="the Slurm partition; empty: the default one",
                max_length=100,
            ),
        ),
        migrations.AddField(
            model_name="experiment",
            name="time_limit_minutes",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="the Slurm job's time limit; empty: the partition's",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="experiment",
            name="scheduler_job_id",
            field=models.CharField(blank=True, db_index=True, max_length=32),
        ),
        migrations.AddField(
            model_name="experiment",
            name="scheduler_state",
            field=models.CharField(blank=True, max_length=32),
        ),
        migrations.AddField(
            model_name="experiment",
            name="scheduler_reason",
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.AddField(
            model_name="experiment",
            name="scheduler_restarts",
            field=models.PositiveIntegerField(default=0),
        ),
    ]
