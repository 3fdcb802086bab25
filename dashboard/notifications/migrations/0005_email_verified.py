from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0004_stalled"),
    ]

    operations = [
        migrations.AddField(
            model_name="notificationsettings",
            name="email_verified",
            field=models.EmailField(blank=True, max_length=254),
        ),
        migrations.AddField(
            model_name="notificationsettings",
            name="email_verified_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
