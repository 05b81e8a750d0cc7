locals {
  spot   = var.tier == "spot"
  labels = merge(var.labels, { "broker-pool" = var.pool_name, "broker-tier" = var.tier })

  user_data = templatefile("${path.module}/templates/cloud-init.yaml.tftpl", {
    pool_name          = var.pool_name
    offer_id           = var.offer_id
    tier               = var.tier
    redis_url          = var.redis_url
    project            = var.project
    secret_id          = var.agent_token_secret_id
    checkpoints        = "gs://${var.checkpoint_bucket}/${var.checkpoint_prefix}"
    broker_package_url = var.broker_package_url
    registration_token = var.registration_token == null ? "" : var.registration_token
    key_prefix         = var.key_prefix
    shards             = var.shards
  })
}

resource "google_service_account" "agent" {
  project      = var.project
  account_id   = substr("broker-${var.pool_name}", 0, 30)
  display_name = "broker agents of pool ${var.pool_name}"
}

# Objects under the checkpoint prefix only (an IAM condition on the object name).
resource "google_storage_bucket_iam_member" "checkpoints" {
  bucket = var.checkpoint_bucket
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.agent.email}"

  condition {
    title      = "broker-checkpoint-prefix"
    expression = "resource.name.startsWith(\"projects/_/buckets/${var.checkpoint_bucket}/objects/${var.checkpoint_prefix}\")"
  }
}

resource "google_secret_manager_secret_iam_member" "token" {
  project   = var.project
  secret_id = var.agent_token_secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.agent.email}"
}

resource "google_compute_instance" "agent" {
  count        = var.instance_count
  project      = var.project
  zone         = var.zone
  name         = "broker-${var.pool_name}-${count.index}"
  machine_type = var.machine_type
  labels       = local.labels

  boot_disk {
    initialize_params {
      image = var.image
      size  = var.boot_disk_gb
      type  = "pd-balanced"
    }
  }

  network_interface {
    network    = var.network
    subnetwork = var.subnetwork
    access_config {} # an ephemeral external IP for outbound traffic; no firewall rule lets anything in
  }

  dynamic "guest_accelerator" {
    for_each = var.accelerator_count > 0 ? [1] : []
    content {
      type  = var.accelerator_type
      count = var.accelerator_count
    }
  }

  # Spot VMs are deleted when preempted; GPUs cannot live-migrate, so maintenance terminates.
  scheduling {
    provisioning_model          = local.spot ? "SPOT" : "STANDARD"
    preemptible                 = local.spot
    automatic_restart           = false
    instance_termination_action = local.spot ? "DELETE" : null
    on_host_maintenance         = "TERMINATE"
  }

  service_account {
    email  = google_service_account.agent.email
    scopes = ["cloud-platform"]
  }

  metadata = {
    user-data = local.user_data
  }

  depends_on = [google_secret_manager_secret_iam_member.token, google_storage_bucket_iam_member.checkpoints]
}
